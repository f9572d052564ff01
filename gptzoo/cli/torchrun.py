"""What a command needs to know of a torchrun launch: which process reports."""

from __future__ import annotations

import argparse
import os

TORCHRUN_COMMANDS = ("train", "sweep")
"""The commands that run in every process of a torchrun launch (the first one reports)."""


def first_process(args: argparse.Namespace) -> bool:
    """False in the other processes of a torchrun training or sweep (only the first one reports)."""
    if args is None or args.command not in TORCHRUN_COMMANDS:
        return True
    return env_int("RANK", 0) == 0


def env_int(name: str, default: int) -> int:
    """An integer that torchrun sets in the environment, or ``default`` when it is unset or not one."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default

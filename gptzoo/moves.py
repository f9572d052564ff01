"""Public names that moved from one module to another, the old import kept working: one :class:`Move` per
name (:data:`MOVES`, part of the changelog of docs/plugins.md). The old module answers it through its
module ``__getattr__`` (PEP 562) with :func:`moved`: the same object, with one GptzooWarning.

This module imports nothing of gptzoo's but its errors, so that any module, the lowest included
(gptzoo.hookspecs, gptzoo.registry), may answer its old names through it.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any

from gptzoo.errors import GptzooWarning


@dataclass(frozen=True)
class Move:
    """A public name that moved to another module within contract ``version``, the old import kept working."""

    name: str
    old: str
    new: str
    version: int


MOVES: tuple[Move, ...] = tuple(
    Move(name, "gptzoo.interfaces", home, 2)
    for name, home in (
        ("KVCache", "gptzoo.model.kv_cache"),
        ("TensorMap", "gptzoo.hf.tensor_map"),
        ("DecodePlan", "gptzoo.inference.plan"),
        ("Buffer", "gptzoo.inference.plan"),
        ("PositionStep", "gptzoo.inference.plan"),
    )
)
MOVES += tuple(
    Move(name, old, new, version)
    for name, old, new, version in (
        ("check_finite", "gptzoo.inference.generate", "gptzoo.inference.engine", 6),
        ("within_vocab", "gptzoo.inference.generate", "gptzoo.inference.engine", 6),
        *(
            (name, "gptzoo.inference.generate", "gptzoo.inference.paths", 6)
            for name in ("EAGER", "NATIVE", "SPLIT", "LOWERING_FIX", "EagerComponent")
        ),
        ("RegisterLowering", "gptzoo.hookspecs", "gptzoo.inference.hooks", 7),
        ("RegisterCacheRows", "gptzoo.hookspecs", "gptzoo.inference.hooks", 7),
        ("RegisterHFLayout", "gptzoo.hookspecs", "gptzoo.hf.hooks", 7),
        ("RegisterAdapterParts", "gptzoo.hookspecs", "gptzoo.adapters.hooks", 7),
        ("HFLayout", "gptzoo.registry", "gptzoo.hf.hooks", 7),
    )
)
"""Every moved name, oldest first: implementations that gptzoo.interfaces held beside the contract; the
decoding loop's checks and its path report, which moved out of generate.py with the one engine; the
subsystems' hook types, which moved to each subsystem's hooks module (gptzoo.class_table)."""


def move_message(move: Move) -> str:
    """The warning of an import of ``move.name`` from its old module."""
    return (
        f"{move.old}.{move.name} moved to {move.new}.{move.name}; import it from there "
        f"(from {move.new} import {move.name}): the old path works for now, with this warning"
    )


def moved(module: str, name: str) -> Any:
    """``module.name`` looked up through the module's ``__getattr__``: the object at its new home, with
    one GptzooWarning; an AttributeError, as Python words it, for a name that never lived there."""
    for move in MOVES:
        if (move.old, move.name) == (module, name):
            warnings.warn(move_message(move), GptzooWarning, stacklevel=3)
            return getattr(importlib.import_module(move.new), name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")

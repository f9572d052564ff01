"""What the command line needs of sweeps while it parses, without torch: the budget kinds, the file that
marks a sweep directory, and the shipped specs (gptzoo/sweeps/NAME.toml)."""

from __future__ import annotations

from pathlib import Path

BUDGETS = ("steps", "tokens", "flops")
SWEEP_RECORD = "sweep.json"
"""In a sweep directory: the spec it runs and what decides its results."""


def shipped_sweeps() -> dict[str, Path]:
    folder = Path(__file__).resolve().parent.parent / "sweeps"
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


SWEEPS = tuple(shipped_sweeps())

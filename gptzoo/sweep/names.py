"""Names every part of a sweep shares, importable without torch (the command line reads them while it
parses): the budget kinds, a sweep directory's layout, what counts as a spike, the shipped specs
(recipes/sweeps/NAME.toml)."""

from __future__ import annotations

from pathlib import Path

BUDGETS = ("steps", "tokens", "flops")
SWEEP_RECORD = "sweep.json"
"""In a sweep directory: the spec it runs and what decides its results."""
RUNS = "runs"
"""SWEEP/runs/VARIANT/seed-S: the run directories."""
RESULTS = "results"
"""SWEEP/results/VARIANT/seed-S.json: each run's result, once trained and evaluated (or diverged)."""
DATA = "data"
"""SWEEP/data: the data a spec prepares."""
SPIKE = 1.0
"""A training loss this many nats above its running minimum is a spike; a final validation loss this many
nats above the run's best means the run came apart (diverged), as a non-finite loss does."""


def shipped_sweeps() -> dict[str, Path]:
    import gptzoo_recipes

    folder = Path(gptzoo_recipes.__file__).resolve().parent / "sweeps"
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


SWEEPS = tuple(shipped_sweeps())

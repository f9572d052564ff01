"""A training run's directory: its recipe, its metrics, and its checkpoints.

    RUN/recipe.toml                  the resolved recipe the run trains
    RUN/metrics.jsonl                one JSON object per logged step and per evaluation
    RUN/checkpoints/step-000200/     a gptzoo checkpoint (model.safetensors + recipe.toml, loadable
                                     by `gptzoo generate --checkpoint`) plus train_state.pt: the
                                     optimizer state, the step, the RNG states and the data position

Each checkpoint directory is written beside its final name and renamed into place when complete
(gptzoo.atomic), so a save interrupted midway leaves the previous checkpoints as they were; the
newest complete one is where `--resume` continues. train_state.pt is read with
``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary pickles.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError
from gptzoo.model.checkpoint import WEIGHTS, write_files
from gptzoo.recipe import Recipe

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "train_state.pt"
_STEP_DIR = re.compile(r"step-(\d+)")


def checkpoint_dirs(run: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the complete checkpoints, oldest first."""
    root = run / CHECKPOINTS
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = _STEP_DIR.fullmatch(path.name)
        if match and (path / STATE).is_file() and (path / WEIGHTS).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def save(
    run: Path, step: int, recipe: Recipe, model_state: dict[str, torch.Tensor], state: dict[str, Any], *, keep: int
) -> Path:
    """Write checkpoint ``step`` atomically, then remove all but the newest ``keep``."""
    out = run / CHECKPOINTS / f"step-{step:06d}"
    with new_directory(out) as tmp:
        write_files(tmp, model_state, recipe)
        torch.save(state, tmp / STATE)
    for _, old in checkpoint_dirs(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def remove_partial(run: Path) -> None:
    """Delete what saves killed midway left behind (their temporary ``.step-*`` directories)."""
    root = run / CHECKPOINTS
    for path in root.glob(".step-*") if root.is_dir() else ():
        shutil.rmtree(path, ignore_errors=True)


def load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model tensors and the training state of one checkpoint directory."""
    try:
        tensors = load_file(str(path / WEIGHTS))
        state = torch.load(path / STATE, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc}") from None
    missing = [
        key for key in ("step", "optimizer", "rng", "world_size") if not isinstance(state, dict) or key not in state
    ]
    if missing:
        raise CheckpointError(f"{path / STATE} is not a gptzoo training state: {', '.join(missing)} missing")
    return tensors, state


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_metrics(run: Path) -> list[dict[str, Any]]:
    path = run / METRICS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a killed run (or still being written)
            continue
    return records


def truncate_metrics(run: Path, step: int) -> None:
    """Forget the records after ``step`` (a resumed run logs them again)."""
    kept = [r for r in read_metrics(run) if r.get("step", 0) <= step]
    write_text_atomically(run / METRICS, "".join(json.dumps(r) + "\n" for r in kept))

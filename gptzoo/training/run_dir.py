"""A training run's directory: its recipe, its metrics, its checkpoints, and its lock.

    RUN/recipe.toml                  the resolved recipe the run trains
    RUN/metrics.jsonl                one JSON object per logged step and per evaluation
    RUN/checkpoints/step-000200/     a gptzoo checkpoint (model.safetensors + recipe.toml, loadable
                                     by `gptzoo generate --checkpoint`) plus train_state.pt: the
                                     optimizer state, the step, the RNG states and the data position
    RUN/.lock                        while a run trains: flock'ed by it, holding its pid

Each checkpoint directory is written beside its final name and renamed into place when complete
(gptzoo.atomic), so a save interrupted midway leaves the previous checkpoints as they were; the
newest complete one is where `--resume` continues. train_state.pt is read with
``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary pickles, and
every field is checked before it is used.

One run at a time: :func:`locked` holds an exclusive ``fcntl.flock`` on RUN/.lock for the run's
whole life. The kernel drops the lock when its process ends however it ends (even SIGKILL), so a
lock file left behind by a killed run is stale and never blocks the next one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gptzoo.atomic import default_mode, new_directory
from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.model.checkpoint import WEIGHTS, write_files
from gptzoo.recipe import Recipe

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "train_state.pt"
LOCK = ".lock"
_STEP_DIR = re.compile(r"step-(\d+)")
_LOSSES = ("loss", "val_loss")
"""Metrics keys plot reads: a record whose value there is not a number (or null) is skipped."""


class WriteError(GptzooError):
    """A file of the run (its recipe, its metrics) could not be written."""


def write_problem(exc: OSError | SafetensorError) -> str:
    """Why a write failed, for people: a full disk says so."""
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or "os error 28" in str(exc):  # safetensors reports ENOSPC in its message only
        return "the disk is full (No space left on device)"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


# --- the lock ---------------------------------------------------------------------------------


@contextmanager
def locked(run: Path) -> Iterator[None]:
    """Hold ``run``'s lock for the ``with`` block, creating ``run``; a directory this created and
    nothing wrote into is removed again.

    Raises:
        GptzooError: another process holds the lock (named by its pid), ``run`` is a file, or it cannot be written.
    """
    if run.exists() and not run.is_dir():
        raise GptzooError(f"--out {run} is a file, not a run directory; choose another --out")
    created = not run.exists()
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GptzooError(
            f"cannot create the run directory {run}: {write_problem(exc)}; choose another --out"
        ) from None
    path = run / LOCK
    fd = _acquire(path, run)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # still locked: a run that opened this file meanwhile sees it replaced
        os.close(fd)
        if created:
            with suppress(OSError):
                run.rmdir()  # only if empty: the run failed before writing anything


def _acquire(path: Path, run: Path) -> int:
    """A descriptor of ``path`` holding its exclusive flock, with this process's pid written in."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise GptzooError(f"cannot write {path}: {write_problem(exc)}; choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who, stop = (f"pid {holder}", f"stop it (kill {holder})") if holder.isdigit() else ("it", "stop it")
            raise GptzooError(
                f"{run} is in use by another `gptzoo train` ({who} holds {path}); "
                f"wait for it to finish or {stop}, or choose another --out"
            ) from None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # the holder removed this file as it finished: lock the one there now
    with suppress(OSError):  # a full disk: the lock holds without the pid, and the run's own writes say what is wrong
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def others(run: Path) -> list[Path]:
    """What ``run`` holds besides the lock."""
    return [p for p in run.iterdir() if p.name != LOCK] if run.is_dir() else []


# --- checkpoints ------------------------------------------------------------------------------


def _step_dirs(run: Path) -> list[tuple[int, Path, bool]]:
    """(step, directory, complete) of every ``step-*`` directory, oldest first."""
    root = run / CHECKPOINTS
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = _STEP_DIR.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path, (path / STATE).is_file() and (path / WEIGHTS).is_file()))
    return sorted(found)


def checkpoint_dirs(run: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the complete checkpoints, oldest first."""
    return [(step, path) for step, path, complete in _step_dirs(run) if complete]


def latest(run: Path) -> Path | None:
    """The newest complete checkpoint, if any."""
    found = checkpoint_dirs(run)
    return found[-1][1] if found else None


def save(
    run: Path, step: int, recipe: Recipe, model_state: dict[str, torch.Tensor], state: dict[str, Any], *, keep: int
) -> Path:
    """Write checkpoint ``step`` atomically, then prune: all but the newest ``keep`` complete ones go,
    and so do incomplete ``step-*`` directories older than the newest complete one.

    Raises:
        CheckpointError: a write failed (the disk is full...): nothing of this step is left, the older checkpoints are.
    """
    out = run / CHECKPOINTS / f"step-{step:06d}"
    if out.is_dir() and not ((out / STATE).is_file() and (out / WEIGHTS).is_file()):
        shutil.rmtree(out, ignore_errors=True)  # a half-deleted checkpoint where this one goes
    with new_directory(out) as tmp:
        name = WEIGHTS
        try:
            write_files(tmp, model_state, recipe)
            name = STATE
            with (tmp / STATE).open("wb") as f:  # a file object: a full disk is an OSError, not a torch RuntimeError
                torch.save(state, f)
        except (OSError, SafetensorError, RuntimeError) as exc:  # new_directory removes tmp
            if isinstance(exc, RuntimeError):  # torch.save's zip writer hides a failed write behind its own error
                if not isinstance(exc.__context__, OSError):
                    raise
                exc = exc.__context__
            if isinstance(exc, OSError) and exc.filename:
                name = Path(exc.filename).name
            raise CheckpointError(
                f"cannot write {out / name}: {write_problem(exc)}; nothing of step {step} was saved, {intact(run)}"
            ) from None
    found = _step_dirs(run)
    newest = max(s for s, _, complete in found if complete)
    complete = [p for _, p, c in found if c]
    stale = [p for s, p, c in found if not c and s < newest]
    for old in [*complete[:-keep], *stale]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def intact(run: Path) -> str:
    """After a failed write: the checkpoint that is intact, or that none was written."""
    last = latest(run)
    if last is None:
        return f"and no checkpoint was written (remove {run} to start over)"
    return f"the previous checkpoint {last} is intact (resume with --resume once this is fixed)"


def kept(run: Path) -> str:
    """After Ctrl-C: the last complete checkpoint, or that none was written."""
    last = latest(run)
    if last is not None:
        return f"the last complete checkpoint is {last} (resume with --resume)"
    if others(run):
        return f"no checkpoint was written (remove {run} to start over)"
    return "nothing was written"


def remove_partial(run: Path) -> None:
    """Delete what saves killed midway left behind (their temporary ``.step-*`` directories)."""
    root = run / CHECKPOINTS
    for path in root.glob(".step-*") if root.is_dir() else ():
        shutil.rmtree(path, ignore_errors=True)


# --- reading a checkpoint back ----------------------------------------------------------------

_MISSING = object()


def _shown(value: Any) -> str:
    """A value in a message: short; a tensor by its dtype and shape."""
    if value is _MISSING:
        return "missing"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:4]}" if value else "an empty dict"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _byte_vector(value: Any, size: int | None = None) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.uint8
        and value.ndim == 1
        and (size is None or value.numel() == size)
    )


def state_problem(state: Any, step: int) -> str | None:
    """What is wrong with a loaded training state, or None; ``step`` is the one in its directory's name."""
    if not isinstance(state, dict):
        return f"it holds {_shown(state)}, expected a dict of training state"

    def value(field: str) -> Any:
        head, _, rest = field.partition(".")
        inner = state.get(head, _MISSING)
        return inner.get(rest, _MISSING) if rest and isinstance(inner, dict) else inner

    optimizer, rng, scaler = value("optimizer"), value("rng"), state.get("scaler", {})
    groups = optimizer.get("param_groups") if isinstance(optimizer, dict) else None
    rng_size = torch.get_rng_state().numel()
    checks = [
        ("step", _whole(value("step"), 0) and value("step") == step, f"{step}, the step in its directory's name"),
        ("skipped", _whole(state.get("skipped", 0), 0) and state.get("skipped", 0) <= step, f"0 to {step}"),
        ("windows_seen", _whole(state.get("windows_seen", 0), 0), "a whole number >= 0"),
        ("world_size", _whole(value("world_size"), 1), "a whole number >= 1 (the processes that trained it)"),
        ("optimizer", isinstance(optimizer, dict), "AdamW's state (a dict of 'state' and 'param_groups')"),
        ("optimizer.state", isinstance(value("optimizer.state"), dict), "a dict of each parameter's AdamW moments"),
        (
            "optimizer.param_groups",
            isinstance(groups, list)
            and bool(groups)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups),
            "a non-empty list of parameter groups",
        ),
        ("rng", isinstance(rng, dict), "a dict of random number generator states"),
        ("rng.cpu", _byte_vector(value("rng.cpu"), rng_size), f"a uint8 tensor of shape ({rng_size},)"),
        ("rng.cuda", not isinstance(rng, dict) or "cuda" not in rng or _byte_vector(rng["cuda"]), "a uint8 vector"),
        (
            "scaler",
            isinstance(scaler, dict) and all(_number(v) for v in scaler.values()),
            "the float16 loss scaler's state (a dict of numbers; empty in other precisions)",
        ),
    ]
    for field, ok, expected in checks:
        if not ok:
            return f"{field} is {_shown(scaler if field == 'scaler' else value(field))}, expected {expected}"
    return None


def load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model tensors and the training state of one checkpoint directory, every field of the state checked.

    Raises:
        CheckpointError: a file that cannot be read, or a field of the wrong type or out of range (named).
    """
    try:
        tensors = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path / WEIGHTS}: {exc}") from None
    try:
        state = torch.load(path / STATE, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling or zip failure is an unreadable file
        raise CheckpointError(f"cannot read the checkpoint {path / STATE}: {type(exc).__name__}: {exc}") from None
    match = _STEP_DIR.fullmatch(path.name)
    problem = state_problem(state, int(match.group(1)) if match else -1)
    if problem is not None:
        raise CheckpointError(
            f"{path / STATE} is corrupt: {problem}; move {path} away to resume from an earlier checkpoint, "
            "or start a new --out"
        )
    return tensors, state


# --- text files and metrics -------------------------------------------------------------------


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename.

    Raises:
        WriteError: the write failed (full disk, no permission...); ``path`` is as it was and no temp file is left.
    """
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.fchmod(fd, default_mode(directory=False))  # mkstemp's 0o600 is for temporary files
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise WriteError(f"cannot write {path}: {write_problem(exc)}") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def append_metrics(run: Path, entry: dict[str, Any]) -> None:
    """Add one record to RUN/metrics.jsonl, in one write.

    Raises:
        WriteError: the write failed (a full disk says so), naming the file.
    """
    path = run / METRICS
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise WriteError(f"cannot append to {path}: {write_problem(exc)}") from None


def _usable(record: Any) -> bool:
    """A metrics record: a JSON object whose step is a whole number and whose losses are numbers or null."""
    return (
        isinstance(record, dict)
        and _whole(record.get("step"), 0)
        and all(record.get(k) is None or _number(record[k]) for k in _LOSSES)
    )


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl's records; lines torn by a killed run, and lines that are not usable records, are skipped."""
    path = run / METRICS
    try:
        lines = path.read_bytes().splitlines() if path.is_file() else []
    except OSError as exc:
        raise GptzooError(f"cannot read {path}: {exc.strerror}") from None
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # invalid JSON or UTF-8: a line torn by a killed run (or still being written)
            continue
        if _usable(record):
            records.append(record)
    return records


def truncate_metrics(run: Path, step: int) -> None:
    """Forget the records after ``step`` (a resumed run logs them again), and the lines that are not records."""
    records = [r for r in read_metrics(run) if r["step"] <= step]
    write_text_atomically(run / METRICS, "".join(json.dumps(r) + "\n" for r in records))

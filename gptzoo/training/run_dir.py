"""A training run's directory: its recipe, its metrics, its checkpoints, and its lock.

    RUN/recipe.toml                  the resolved recipe the run trains
    RUN/metrics.jsonl                one JSON object per logged step and per evaluation
    RUN/checkpoints/step-000200/     a gptzoo checkpoint (model.safetensors + recipe.toml, loadable
                                     by `gptzoo generate --checkpoint`) plus train_state.pt: the
                                     optimizer state, the step, the RNG states and the data position
    RUN/.lock                        while a run trains: flock'ed by it, holding its pid

Each checkpoint directory is written beside its final name and renamed into place when complete
(gptzoo.atomic), so a save interrupted midway leaves the previous checkpoints as they were; the
newest complete one is where `--resume` continues. A step's metrics records are in metrics.jsonl,
flushed to the disk, before its checkpoint is saved, so a run resumed from a checkpoint has the
records of its step, and forgets (and logs again) only those after it. train_state.pt is read with
``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary pickles, and
every field is checked before it is used.

One run at a time: :func:`locked` holds an exclusive ``fcntl.flock`` on RUN/.lock for the run's
whole life. The kernel drops the lock when its process ends however it ends (even SIGKILL), so a
lock file left behind by a killed run is stale and never blocks the next one. A .lock that is not
such a file (a symbolic or hard link, a directory, a file holding other text) is refused, never
written.

Everything a resume reads and prunes lies inside the run: RUN/checkpoints and each step-* in it
must be real directories (:func:`check_checkpoints`). A save never leaves a visible incomplete
step-N, so one newer than the newest complete checkpoint is someone's files, and the resume is
refused; pruning removes only the files a save writes, and a directory it leaves empty.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import pickle
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gptzoo.atomic import default_mode, new_directory, write_problem
from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.model.checkpoint import RECIPE, WEIGHTS, write_files
from gptzoo.recipe import Recipe
from gptzoo.recipe.schema import MAX_INT
from gptzoo.untrusted import checkpoint_file, dtype_name, file_kind, pickle_refusal, refuse_constant

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "train_state.pt"
LOCK = ".lock"
_STEP_DIR = re.compile(r"step-(\d+)")
_PARTIAL = re.compile(r"\.step-\d+\.[a-z0-9_]{8}")
"""The temporary directory of a save (gptzoo.atomic.new_directory: tempfile.mkdtemp beside step-N)."""
SAVED = (WEIGHTS, RECIPE, STATE)
"""The files a save writes into a checkpoint directory: all that pruning removes."""
_LOCK_TEXT = re.compile(rb"\d{0,20}\n?")
"""What a lock file holds: nothing, or the pid of the run that holds it (written after the flock)."""
_LOSSES = ("loss", "val_loss")
"""Metrics keys plot reads: a record whose value there is not a number (or null) is skipped."""
LOSS_LIMIT = float(torch.finfo(torch.float32).max)
"""The largest loss a record may hold: training computes losses in float32."""


class WriteError(GptzooError):
    """A file of the run (its recipe, its metrics) could not be written."""


# --- the lock ---------------------------------------------------------------------------------


@contextmanager
def locked(run: Path) -> Iterator[None]:
    """Hold ``run``'s lock for the ``with`` block, creating ``run``; a directory this created and
    nothing wrote into is removed again.

    Raises:
        GptzooError: another process holds the lock (named by its pid), ``run`` is a file, it cannot be written,
            or its .lock is not a lock file gptzoo made.
    """
    if run.is_symlink():
        raise GptzooError(f"--out {run} is a symbolic link; give the run directory itself, or another --out")
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
        with suppress(OSError):  # still locked: a run that opened this file meanwhile sees it replaced
            if _same_file(os.lstat(path), os.fstat(fd)):  # only the file this run locked
                path.unlink()
        os.close(fd)
        if created:
            with suppress(OSError):
                run.rmdir()  # only if empty: the run failed before writing anything


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _acquire(path: Path, run: Path) -> int:
    """A descriptor of ``path`` holding its exclusive flock, with this process's pid written in.

    ``path`` is opened without following a symbolic link, and written only once it is known to be a
    lock file: a regular file of one name (no hard link elsewhere) holding at most a pid.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise _not_a_lock(path, "a symbolic link" if exc.errno == errno.ELOOP else "a directory") from None
            raise GptzooError(f"cannot write {path}: {write_problem(exc)}; choose another --out") from None
        problem = _lock_problem(fd)
        if problem is not None:
            os.close(fd)
            raise _not_a_lock(path, problem)
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
            current = _same_file(os.lstat(path), os.fstat(fd))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # the holder removed this file as it finished: lock the one there now
    with suppress(OSError):  # a full disk: the lock holds without the pid, and the run's own writes say what is wrong
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _lock_problem(fd: int) -> str | None:
    """Why the open file ``fd`` is not a lock file gptzoo made, or None."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return file_kind(info.st_mode)
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} hard links (its contents live under another name too)"
    if not _LOCK_TEXT.fullmatch(os.pread(fd, 32, 0)):
        return "a file holding something other than a process id"
    return None


def _not_a_lock(path: Path, what: str) -> GptzooError:
    return GptzooError(f"{path} is not a lock file gptzoo made: it is {what}; move it away, or choose another --out")


def others(run: Path) -> list[Path]:
    """What ``run`` holds besides the lock (which :func:`locked` has checked)."""
    return [p for p in run.iterdir() if p.name != LOCK] if run.is_dir() else []


# --- checkpoints ------------------------------------------------------------------------------


def _steps(run: Path) -> list[tuple[int, Path]]:
    """(step, entry) of every ``step-*`` name in RUN/checkpoints, oldest first; none if that is not a real
    directory (a symbolic link is never followed)."""
    root = run / CHECKPOINTS
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return []
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), root / name) for name in names if (m := _STEP_DIR.fullmatch(name))]
    return sorted(found)


def _real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _lacks(path: Path) -> str | None:
    """What checkpoint directory ``path`` lacks of a complete checkpoint (its weights and training state), or None."""
    problems = []
    for name in (WEIGHTS, STATE):
        file = path / name
        try:
            mode = os.stat(file).st_mode
        except FileNotFoundError:
            problems.append(f"its {name} is {'a symbolic link to nothing' if file.is_symlink() else 'missing'}")
            continue
        except OSError as exc:
            problems.append(f"its {name} cannot be read ({exc.strerror})")
            continue
        if not stat.S_ISREG(mode):
            problems.append(f"its {name} is {file_kind(mode)}")
    return " and ".join(problems) or None


def _step_dirs(run: Path) -> list[tuple[int, Path, bool]]:
    """(step, directory, complete) of every ``step-*`` that is a real directory, oldest first."""
    return [(step, path, _lacks(path) is None) for step, path in _steps(run) if _real_directory(path)]


def checkpoint_dirs(run: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the complete checkpoints, oldest first."""
    return [(step, path) for step, path, complete in _step_dirs(run) if complete]


def latest(run: Path) -> Path | None:
    """The newest complete checkpoint, if any."""
    found = checkpoint_dirs(run)
    return found[-1][1] if found else None


def check_checkpoints(run: Path) -> None:
    """Before a resume reads or changes anything: RUN/checkpoints and every ``step-*`` in it are real
    directories inside ``run`` (what the resume reads, and later prunes), and no incomplete one is newer
    than the newest complete checkpoint (a save never leaves one: it is someone's files).

    Raises:
        CheckpointError: naming the entry and the way on.
    """
    root = run / CHECKPOINTS
    try:
        mode = os.lstat(root).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise CheckpointError(
            f"{root} is {file_kind(mode)}, not a directory; a resume reads and prunes only checkpoints inside {run}: "
            "put a copy of the checkpoints there instead, or start a new --out"
        )
    for _, path in _steps(run):
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise CheckpointError(
                f"{path} is {file_kind(mode)}, not a checkpoint directory; a resume reads and prunes only checkpoints "
                f"inside {run}: move it away (a copy of a checkpoint may take its place)"
            )
    found = _step_dirs(run)
    complete = [(step, path) for step, path, done in found if done]
    newest, last = complete[-1] if complete else (-1, None)
    newer = [path for step, path, _ in found if step > newest]  # incomplete, all of them
    if not newer:
        return
    path = newer[-1]
    if last is None:
        raise CheckpointError(
            f"{path} is incomplete ({_lacks(path)}) and {run} has no complete checkpoint to resume: restore what it "
            f"lacks, or remove {run} and train without --resume"
        )
    raise CheckpointError(
        f"{path} is incomplete ({_lacks(path)}), yet newer than the last complete checkpoint {last}: a resume would "
        f"go back to {last.name} and later replace it; restore what it lacks, or move it away to resume from {last}"
    )


def save(
    run: Path, step: int, recipe: Recipe, model_state: dict[str, torch.Tensor], state: dict[str, Any], *, keep: int
) -> Path:
    """Flush RUN/metrics.jsonl to the disk, write checkpoint ``step`` atomically, then prune: all but the
    newest ``keep`` complete ones go, and so do incomplete ``step-*`` directories older than the newest
    complete one (of each, the files a save writes, and the directory if that leaves it empty: a file
    someone else put there stays).

    Raises:
        WriteError: metrics.jsonl cannot be flushed: nothing of this step is written.
        CheckpointError: a write failed (the disk is full...): nothing of this step is left, the older checkpoints are.
    """
    out = run / CHECKPOINTS / f"step-{step:06d}"
    sync_metrics(run)
    with new_directory(out) as tmp:
        name = WEIGHTS
        try:
            write_files(tmp, model_state, recipe)
            name = STATE
            with (tmp / STATE).open("wb") as f:  # a file object: a full disk is an OSError, not a torch RuntimeError
                torch.save(state, f)
        except (OSError, SafetensorError, RuntimeError) as exc:  # new_directory removes tmp
            if isinstance(exc, RuntimeError):  # torch.save's zip writer hides a failed write behind its own error
                hidden = _hidden(exc)
                if isinstance(hidden, KeyboardInterrupt):  # Ctrl-C in one of its writes: an interrupted run
                    raise KeyboardInterrupt from None
                if hidden is None:
                    raise
                exc = hidden
            if isinstance(exc, OSError) and exc.filename:
                name = Path(exc.filename).name
            raise CheckpointError(
                f"cannot write {out / name}: {write_problem(exc)}; nothing of step {step} was saved; {intact(run)}"
            ) from None
    found = _step_dirs(run)
    newest = max(s for s, _, complete in found if complete)
    complete = [p for _, p, c in found if c]
    stale = [p for s, p, c in found if not c and s < newest]
    for old in [*complete[:-keep], *stale]:
        _prune(old)
    return out


def _prune(path: Path) -> None:
    """Remove what a save wrote into checkpoint directory ``path``, and the directory if that empties it."""
    for name in SAVED:
        with suppress(OSError):  # gone already, or not a file (a directory someone made): left as it is
            (path / name).unlink()
    with suppress(OSError):
        path.rmdir()


def _hidden(exc: RuntimeError) -> OSError | KeyboardInterrupt | None:
    """What torch's zip writer hid behind its RuntimeError: the OSError of a failed write, or a Ctrl-C."""
    context = exc.__context__
    while context is not None and not isinstance(context, OSError | KeyboardInterrupt):
        context = context.__context__
    return context


def intact(run: Path) -> str:
    """After a failed write: the checkpoint that is intact, or that there is none (a new run that
    fails before its first checkpoint leaves nothing: see :func:`discard`)."""
    last = latest(run)
    if last is None:
        return "no checkpoint had been written, so nothing was kept (train again once this is fixed)"
    return f"the previous checkpoint {last} is intact (resume with --resume once this is fixed)"


def kept(run: Path) -> str:
    """After Ctrl-C: the last complete checkpoint, or that none was written (a new run leaves nothing then:
    see :func:`discard`)."""
    last = latest(run)
    if last is not None:
        return f"the last complete checkpoint is {last} (resume with --resume)"
    return "no checkpoint had been written, so nothing was kept"


def discard(run: Path) -> None:
    """Remove what a new run wrote, when it failed or was interrupted before its first checkpoint: nothing
    a resume could use, and a run directory holding it would refuse the next try."""
    if latest(run) is not None:
        return
    remove_partial(run)
    with suppress(OSError):
        (run / CHECKPOINTS).rmdir()  # only if empty
    for name in (RECIPE, METRICS):
        with suppress(OSError):
            (run / name).unlink(missing_ok=True)


def remove_partial(run: Path) -> None:
    """Delete what saves killed midway left behind: their temporary directories (``.step-N.XXXXXXXX``)."""
    root = run / CHECKPOINTS
    if not _real_directory(root):
        return
    for name in os.listdir(root):
        if _PARTIAL.fullmatch(name) and _real_directory(root / name):
            shutil.rmtree(root / name, ignore_errors=True)


# --- reading a checkpoint back ----------------------------------------------------------------

_MISSING = object()


def _shown(value: Any) -> str:
    """A value in a message: short; a tensor by its dtype and shape."""
    if value is _MISSING:
        return "missing"
    if isinstance(value, torch.Tensor):
        if value.ndim == 0 and value.layout == torch.strided and value.device.type == "cpu":
            return f"{_a(value.dtype)} scalar tensor ({value.item()!r})"
        return f"{_a(value.dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:4]}" if value else "an empty dict"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _a(dtype: torch.dtype) -> str:
    """A dtype with its article: "a float32", "an int64"."""
    name = dtype_name(dtype)
    return f"{'an' if name.startswith('int') else 'a'} {name}"


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


def _elsewhere(path: Path) -> str:
    """The way on from a checkpoint that cannot be resumed."""
    return f"move {path} away to resume from an earlier checkpoint, or start a new --out"


def corrupt(path: Path, problem: str) -> CheckpointError:
    """The error of checkpoint ``path`` whose train_state.pt has ``problem`` (a field, what it is and should be)."""
    return CheckpointError(f"{path / STATE} is corrupt: {problem}; {_elsewhere(path)}")


def _read_state(path: Path) -> Any:
    """train_state.pt, unpickled with ``weights_only=True``: tensors and plain containers, nothing that runs."""
    file = path / STATE
    real = checkpoint_file(path, STATE, missing=f"{file} is missing; {_elsewhere(path)}")
    if real.stat().st_size == 0:
        raise CheckpointError(f"{file} is empty: its save was cut short; {_elsewhere(path)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4 ...": the error below says it all
            return torch.load(real, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{file} holds objects gptzoo refuses to unpickle ({pickle_refusal(exc)}); nothing in it ran; "
            f"{_elsewhere(path)}"
        ) from None
    except EOFError:
        raise CheckpointError(f"{file} is truncated: it ends before its data does; {_elsewhere(path)}") from None
    except Exception as exc:  # any other zip or unpickling failure is an unreadable file
        reason = " ".join(str(exc).split()).split(". ")[0]  # torch's first sentence; the rest is about reporting it
        raise CheckpointError(
            f"cannot read the checkpoint {file} ({type(exc).__name__}: {reason}): it is damaged or cut short; "
            f"{_elsewhere(path)}"
        ) from None


def load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model tensors and the training state of one checkpoint directory, every field of the state checked
    (the optimizer's against the model: :func:`optimizer_state`).

    Raises:
        CheckpointError: a file that cannot be read, or a field of the wrong type or out of range (named).
    """
    weights = checkpoint_file(path, WEIGHTS, missing=f"{path / WEIGHTS} is missing; {_elsewhere(path)}")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path / WEIGHTS}: {exc}") from None
    state = _read_state(path)
    match = _STEP_DIR.fullmatch(path.name)
    problem = state_problem(state, int(match.group(1)) if match else -1)
    if problem is not None:
        raise corrupt(path, problem)
    return tensors, state


_GROUP_REQUIRED = ("lr", "betas", "eps", "weight_decay")
"""What every saved AdamW parameter group holds besides its params; other keys are flags, each optional."""
_FROM_RECIPE = {"betas": "beta1, beta2", "eps": "eps"}
"""Hyper-parameters every group takes from [train], by the keys that set them (weight_decay: the first group's)."""
_HOW = ("foreach", "fused")
"""Flags that say how torch runs the step, chosen for each device: True, False or None, whatever ours are."""
_MOMENTS = ("exp_avg", "exp_avg_sq")


def _same(value: Any, ours: Any) -> bool:
    """``value`` (from a file) is ``ours``, of the same kind: no tensor, no string that compares equal."""
    if isinstance(ours, bool) or ours is None:
        return value is ours
    if isinstance(ours, float):
        return _number(value) and value == ours
    if isinstance(ours, tuple | list):
        return isinstance(value, tuple | list) and len(value) == len(ours) and all(map(_same, value, ours))
    return type(value) is type(ours) and value == ours


def _names(names: Any) -> Any:
    """Parameter names without DDP's "module." (a DDP-wrapped model's optimizer holds them with it, its
    state dict without); anything else as it is."""
    return [n.removeprefix("module.") if isinstance(n, str) else n for n in names] if isinstance(names, list) else names


def _group_problem(where: str, group: dict[Any, Any], ours: dict[str, Any]) -> str | None:
    """What is wrong with a saved AdamW parameter group, compared with this run's (``ours``, params aside)."""
    for key in _GROUP_REQUIRED:
        if key not in group:
            return f"{where}.{key} is missing, expected {_shown(ours[key])}"
    for key, value in group.items():
        field = f"{where}.{key}"
        if key == "params":
            continue
        if key not in ours:
            return f"{where} holds {key!r}, which gptzoo's AdamW does not have"
        if key == "lr":
            if not (_number(value) and math.isfinite(value) and value >= 0):
                return f"{field} is {_shown(value)}, expected a finite number >= 0"
        elif key in _HOW:
            if not (value is None or isinstance(value, bool)):
                return f"{field} is {_shown(value)}, expected True, False or None"
        elif key == "names":
            if not _same(_names(value), _names(ours[key])):
                return f"{field} is {_shown(value)}, expected the names of the parameters in params"
        elif not _same(value, ours[key]):
            source = f" (the recipe's {_FROM_RECIPE[key]})" if key in _FROM_RECIPE else ""
            return f"{field} is {_shown(value)}, expected {_shown(ours[key])}{source}"
    return None


def _moments_problem(where: str, moments: Any, param: torch.Tensor, applied: int) -> str | None:
    """What is wrong with one parameter's saved AdamW state: exactly a step count and two moments."""
    if not isinstance(moments, dict):
        return f"{where} is {_shown(moments)}, expected a dict of 'step', 'exp_avg' and 'exp_avg_sq'"
    keys = sorted(map(str, moments))
    if keys != ["exp_avg", "exp_avg_sq", "step"]:
        return f"{where} holds {keys}, expected exactly ['exp_avg', 'exp_avg_sq', 'step']"
    step = moments["step"]
    if not (
        isinstance(step, torch.Tensor)
        and step.device.type == "cpu"
        and step.ndim == 0
        and step.is_floating_point()
        and float(step).is_integer()
        and 1 <= float(step) <= applied
    ):
        return f"{where}.step is {_shown(step)}, expected a scalar float tensor: the updates applied, 1 to {applied}"
    for key in _MOMENTS:
        value = moments[key]
        if not (
            isinstance(value, torch.Tensor)
            and value.device.type == "cpu"  # where torch.load(map_location="cpu") puts every tensor it can
            and value.layout == torch.strided
            and value.dtype == param.dtype
            and value.shape == param.shape
        ):
            return f"{where}.{key} is {_shown(value)}, expected {_a(param.dtype)} tensor of shape {tuple(param.shape)}"
        if not torch.isfinite(value).all():
            return f"{where}.{key} holds non-finite values, expected finite ones"
    if (moments["exp_avg_sq"] < 0).any():
        return f"{where}.exp_avg_sq holds negative values, expected squares (>= 0)"
    return None


def optimizer_state(
    saved: dict[str, Any],
    groups: list[dict[str, Any]],
    params: dict[str, torch.Tensor],
    *,
    applied: int,
    every_step: bool,
) -> dict[str, Any] | str:
    """The AdamW state to restore from ``saved`` (a checkpoint's, its structure checked by :func:`state_problem`),
    or what is wrong with it.

    ``groups`` are this run's parameter groups (from its recipe; their ``names`` the parameters each
    holds), ``params`` the model's parameters by name, ``applied`` the optimizer steps that updated
    the weights (the step less the skipped ones). Every field is checked: the groups must hold these
    parameters with these hyper-parameters, each parameter's state a step count in 1..applied and two
    finite moments of its shape and dtype. ``every_step``: each applied step updated the weights, so
    some parameter must have a state if any step was applied (float16's loss scaler skips steps unseen).
    The state restored takes the moments and step counts from the file, everything else from ``groups``.
    """
    theirs = [_names([str(n) for n in g["params"]]) for g in saved["param_groups"]]
    ours = [_names(list(g["names"])) for g in groups]
    if theirs != ours:
        if list(map(len, theirs)) != list(map(len, ours)):
            return (
                f"optimizer.param_groups hold {list(map(len, theirs))} parameters, expected this model's "
                f"{list(map(len, ours))}"
            )
        i, j = next(
            (i, j) for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) for j in range(len(a)) if a[j] != b[j]
        )
        return f"optimizer.param_groups[{i}].params[{j}] is {theirs[i][j]!r}, expected this model's {ours[i][j]!r}"
    for i, (group, mine) in enumerate(zip(saved["param_groups"], groups, strict=True)):
        problem = _group_problem(f"optimizer.param_groups[{i}]", group, mine)
        if problem is not None:
            return problem
    state = saved["state"]
    if applied == 0 and state:
        name = next(iter(state))
        return (
            f"optimizer.state holds the moments of {_shown(str(name))}, expected none: no update was applied "
            "(skipped is the step: every step was skipped)"
        )
    for name, moments in state.items():
        param = params.get(str(name).removeprefix("module."))
        if param is None:
            return f"optimizer.state holds {_shown(name)}, which is not a parameter of this model"
        problem = _moments_problem(f"optimizer.state[{str(name)!r}]", moments, param, applied)
        if problem is not None:
            return problem
    if every_step and applied > 0 and not state:
        return f"optimizer.state is empty, expected the moments of the parameters {applied} step(s) updated"
    return {
        "state": {
            name: {
                "step": torch.tensor(float(moments["step"]), dtype=torch.float32),
                **{key: moments[key].detach().clone(memory_format=torch.contiguous_format) for key in _MOMENTS},
            }
            for name, moments in state.items()
        },
        "param_groups": [
            {**{k: v for k, v in mine.items() if k != "params"}, "params": list(group["params"])}
            for group, mine in zip(saved["param_groups"], groups, strict=True)
        ],
    }


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


def sync_metrics(run: Path) -> None:
    """Flush RUN/metrics.jsonl to the disk (when there is one): :func:`save` calls it before it renames a
    checkpoint into place, so a checkpoint never outlives the records of its step (a crash of the machine
    between the two would resume from a checkpoint whose step's eval line is lost)."""
    path = run / METRICS
    if not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise WriteError(f"cannot flush {path} to the disk: {write_problem(exc)}") from None


def _finite(value: Any) -> bool:
    """A number as a float is: finite (a 400-digit integer is not: it overflows)."""
    try:
        return _number(value) and math.isfinite(value)
    except OverflowError:
        return False


def _scalar(value: Any) -> bool:
    """A value a record holds: null, a boolean, a string, or a finite number."""
    return value is None or isinstance(value, str | bool) or _finite(value)


def _stat(value: Any) -> bool:
    """A components' statistic in a record (gptzoo.training.stats): component path -> null, a finite number,
    or a list of finite numbers."""
    return isinstance(value, dict) and all(
        isinstance(path, str) and (_scalar(v) or (isinstance(v, list) and all(_finite(x) for x in v)))
        for path, v in value.items()
    )


def _usable(record: Any) -> bool:
    """A metrics record, as :func:`append_metrics` writes them: a JSON object of scalars (and the components'
    statistics, tables of them by component) whose step is a whole number (at most train.max_steps' limit) and
    whose losses are null or numbers in float32's range."""
    return (
        isinstance(record, dict)
        and _whole(record.get("step"), 0)
        and record["step"] <= MAX_INT
        and all(record.get(k) is None or (_finite(record[k]) and abs(record[k]) <= LOSS_LIMIT) for k in _LOSSES)
        and all(_scalar(v) or _stat(v) for v in record.values())
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
            record = json.loads(line, parse_constant=refuse_constant)
        except (ValueError, RecursionError):  # invalid JSON or UTF-8 (a line torn by a killed run), or nested deep
            continue
        if _usable(record):
            records.append(record)
    return records


def truncate_metrics(run: Path, step: int) -> None:
    """Forget the records after ``step`` (a resumed run logs them again), and the lines that are not records."""
    records = [r for r in read_metrics(run) if r["step"] <= step]
    write_text_atomically(run / METRICS, "".join(json.dumps(r) + "\n" for r in records))

"""`gptzoo plot RUN_DIR`: the run's train and validation loss against the step, as a PNG; below it, when the
run logged components' shares (a mixture of experts' expert load, gptzoo.training.stats), a panel of each
one's max/mean by step, per layer: 1.0 is a perfectly even load, E / k a router that sends every token to the
same k of its E experts."""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

from gptzoo.atomic import default_mode, write_problem
from gptzoo.errors import GptzooError, Interrupted
from gptzoo.hookspecs import STAT_MAX_MEAN
from gptzoo.training import run_dir

PLOTS = {
    "png": ("a PNG image", b"\x89PNG\r\n\x1a\n", b"tEXtSoftware\x00Matplotlib version"),
    "pdf": ("a PDF", b"%PDF-", b"/Creator (Matplotlib v"),
    "svg": ("an SVG image", b"<?xml", b"<dc:title>Matplotlib v"),
}
"""The formats whose previous plots plot recognizes, and so may replace: (what the format is, how its files
begin, the mark matplotlib writes into them: near the start of a PNG or an SVG, near the end of a PDF)."""
_NEAR = 1 << 16
"""How far from a file's start (or, for a PDF, its end) the mark of a previous plot is looked for."""


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl into ``out`` (default RUN/loss.png); returns the file written.

    Lines of metrics.jsonl that are not records with a numeric step and loss are skipped, as torn lines are.
    An existing ``out`` is replaced only if it is a previous plot: a file matplotlib drew in the format written.

    Raises:
        GptzooError: no run directory, no losses to plot, or ``out`` cannot be written (named).
        Interrupted: Ctrl-C; nothing was written (no temporary file either).
    """
    run = Path(run)
    path = Path(out) if out is not None else run / "loss.png"
    try:
        return _plot(run, path, given=out is not None)
    except KeyboardInterrupt:
        raise Interrupted(f"nothing was written to {path}") from None


def _plot(run: Path, path: Path, *, given: bool) -> Path:
    if not run.is_dir():
        raise GptzooError(f"no run directory at {run}; give a `gptzoo train --out` directory")
    records = run_dir.read_metrics(run)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if not train and not val:
        if records:
            raise GptzooError(
                f"{run / run_dir.METRICS} has no finite losses to plot yet: the {len(records)} record(s) it holds "
                "have null losses (non-finite)"
            )
        raise GptzooError(f"{run / run_dir.METRICS} has no losses to plot; is {run} a `gptzoo train --out` directory?")
    fix = "give another --out FILE" if given else "give --out FILE in a writable place"
    kind = path.suffix.removeprefix(".").lower() or "png"
    _check_replaceable(path, kind, given=given)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    balance = balance_curves(records)
    if balance:
        fig, (ax, below) = plt.subplots(2, 1, figsize=(8, 7.5), dpi=120, sharex=True, height_ratios=(3, 2))
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    try:
        if kind not in fig.canvas.get_supported_filetypes():
            raise GptzooError(
                f"cannot write {path}: matplotlib has no {kind!r} format; give --out FILE.png (or .pdf, .svg)"
            )
        if train:
            ax.plot(*zip(*train, strict=True), label="train", linewidth=1)
        if val:
            ax.plot(*zip(*val, strict=True), label="val", marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title(run.resolve().name)
        ax.grid(alpha=0.3)
        ax.legend()
        if balance:
            draw_balance(below, balance)
            ax.label_outer()  # the step axis is the panel's below
        fig.tight_layout()
        write_figure(fig, path, kind, fix)
    finally:
        plt.close(fig)
    return path


def balance_curves(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Each component's balance by step (the records' ``NAME_max_mean`` tables, gptzoo.training.stats), labelled
    by its path in the model, and by the statistic's name when the run logs more than one."""
    names = sorted({k for r in records for k, v in r.items() if k.endswith(STAT_MAX_MEAN) and isinstance(v, dict)})
    curves: dict[str, list[tuple[int, float]]] = {}
    for name in names:
        for r in records:
            for where, value in (r.get(name) or {}).items():
                if isinstance(value, int | float):
                    label = where if len(names) == 1 else f"{where} {name.removesuffix(STAT_MAX_MEAN)}"
                    curves.setdefault(label, []).append((r["step"], value))
    return curves


def draw_balance(ax: Any, curves: dict[str, list[tuple[int, float]]]) -> None:
    """The panel of the components' balance: max/mean by step, one line per component, 1.0 marked."""
    for label, curve in curves.items():
        ax.plot(*zip(*curve, strict=True), label=label, linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("load max / mean (1 = balanced)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)


def write_figure(fig: Any, path: Path, kind: str, fix: str) -> None:
    """Save a matplotlib figure to ``path`` in one rename: complete or not there.

    Raises:
        GptzooError: the write failed, with ``fix``.
    """
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, default_mode(directory=False))  # mkstemp's 0o600 is for temporary files
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=kind)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise GptzooError(f"cannot write {path}: {write_problem(exc)}; {fix}") from None
    except BaseException:  # Ctrl-C in savefig, or any failure of matplotlib's: no temporary file stays
        _remove(tmp)
        raise


def _remove(tmp: str | None) -> None:
    if tmp is not None:
        with suppress(OSError):  # where the write failed (a parent that is a file, a loop), so may its cleanup
            os.unlink(tmp)


def _check_replaceable(path: Path, kind: str, *, given: bool) -> None:
    """``path`` (``given`` as --out, else the default) may be written: its parent is not a file, and it is
    new or a previous plot."""
    fix = "give another --out FILE" if given else "give --out FILE in a writable place"
    instead = "remove it or " + ("give another --out FILE" if given else "give --out FILE")
    if path.is_dir() and not path.is_symlink():
        raise GptzooError(
            f"--out {path} is a directory; give a file name such as {path / 'loss.png'}"
            if given
            else f"{path} is a directory, where plot writes its PNG by default; move it away, or give --out FILE"
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise GptzooError(f"cannot write {path}: {parent} is a file, not a directory; {fix}")
            break
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GptzooError(f"cannot write {path}: {exc.strerror}; {fix}") from None
    if kind not in PLOTS:
        raise GptzooError(
            f"{path} already exists, and plot replaces only a previous plot it recognizes (a PNG image, a PDF or an "
            f"SVG image); {instead}"
        )
    what, signature, mark = PLOTS[kind]
    refused = f"{path} already exists and is not a previous plot ({what} drawn by matplotlib); {instead}"
    if not stat.S_ISREG(mode):
        raise GptzooError(refused)
    try:
        with path.open("rb") as f:
            head = f.read(_NEAR)
            if kind == "pdf":  # matplotlib writes its document information last
                f.seek(max(0, os.fstat(f.fileno()).st_size - _NEAR))
                near = f.read(_NEAR)
            else:
                near = head
    except OSError as exc:
        raise GptzooError(f"cannot read {path}: {exc.strerror}; {fix}") from None
    if not (head.startswith(signature) and mark in near):
        raise GptzooError(refused)

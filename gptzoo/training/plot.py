"""`gptzoo plot RUN_DIR`: the run's train and validation loss against the step, as a PNG."""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

from gptzoo.errors import GptzooError
from gptzoo.training import run_dir

SIGNATURES = {"png": (b"\x89PNG\r\n\x1a\n", "a PNG image"), "pdf": (b"%PDF-", "a PDF")}
"""The formats whose files plot recognizes by their first bytes: an existing one of these it may replace."""


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl into ``out`` (default RUN/loss.png); returns the file written.

    Lines of metrics.jsonl that are not records with a numeric step and loss are skipped, as torn lines are.
    An existing ``out`` is replaced only if it is an image of the format written (a previous plot).

    Raises:
        GptzooError: no run directory, no losses to plot, or ``out`` cannot be written (named).
    """
    run = Path(run)
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
    path = Path(out) if out is not None else run / "loss.png"
    fix = "give --out FILE in a writable place" if out is None else "give another --out FILE"
    kind = path.suffix.removeprefix(".").lower() or "png"
    _check_replaceable(
        path, kind, fix, "remove it or " + ("give --out FILE" if out is None else "give another --out FILE")
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    if kind not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
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
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format=kind)
        tmp.replace(path)
    except OSError as exc:
        with suppress(OSError):  # where the write failed (a parent that is a file, a loop), so may its cleanup
            tmp.unlink(missing_ok=True)
        raise GptzooError(f"cannot write {path}: {run_dir.write_problem(exc)}; {fix}") from None
    finally:
        plt.close(fig)
    return path


def _check_replaceable(path: Path, kind: str, fix: str, instead: str) -> None:
    """``path`` may be written: its parent is not a file, and it is new or a previous plot."""
    if path.is_dir():
        raise GptzooError(f"--out {path} is a directory; give a file name such as {path / 'loss.png'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise GptzooError(f"cannot write {path}: {parent} is a file, not a directory; {fix}")
            break
    if not path.exists():
        return
    if kind not in SIGNATURES:
        raise GptzooError(
            f"{path} already exists, and plot replaces only a previous plot it recognizes (a PNG image or a PDF); "
            f"{instead}"
        )
    signature, what = SIGNATURES[kind]
    refused = f"{path} already exists and is not {what}; plot replaces only a previous plot: {instead}"
    if not path.is_file():
        raise GptzooError(refused)
    try:
        with path.open("rb") as f:
            head = f.read(len(signature))
    except OSError as exc:
        raise GptzooError(f"cannot read {path}: {exc.strerror}; {fix}") from None
    if head != signature:
        raise GptzooError(refused)

"""`gptzoo plot RUN_DIR`: the run's train and validation loss against the step, as a PNG."""

from __future__ import annotations

import os
from pathlib import Path

from gptzoo.errors import GptzooError
from gptzoo.training import run_dir


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl into ``out`` (default RUN/loss.png); returns the file written.

    Lines of metrics.jsonl that are not records with a numeric step and loss are skipped, as torn lines are.

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
        raise GptzooError(f"{run / run_dir.METRICS} has no losses to plot; is {run} a `gptzoo train --out` directory?")
    path = Path(out) if out is not None else run / "loss.png"
    if path.is_dir():
        raise GptzooError(f"--out {path} is a directory; give a file name such as {path / 'loss.png'}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
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
        fig.savefig(tmp, format=path.suffix.removeprefix(".") or "png")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fix = "give --out FILE in a writable place" if out is None else "give another --out FILE"
        raise GptzooError(f"cannot write {path}: {run_dir.write_problem(exc)}; {fix}") from None
    except ValueError as exc:  # matplotlib: a format it cannot write
        tmp.unlink(missing_ok=True)
        raise GptzooError(f"cannot write {path}: {exc}; give --out FILE.png (or .pdf, .svg)") from None
    finally:
        plt.close(fig)
    return path

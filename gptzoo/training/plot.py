"""`gptzoo plot RUN_DIR`: the run's train and validation loss against the step, as a PNG."""

from __future__ import annotations

from pathlib import Path

from gptzoo.errors import GptzooError
from gptzoo.training import run_dir


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl into ``out`` (default RUN/loss.png); returns the file written."""
    run = Path(run)
    records = run_dir.read_metrics(run)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if not train and not val:
        raise GptzooError(f"{run / run_dir.METRICS} has no losses to plot; is {run} a `gptzoo train --out` directory?")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train", linewidth=1)
    if val:
        ax.plot(*zip(*val), label="val", marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(run.resolve().name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(out) if out is not None else run / "loss.png"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format=path.suffix.removeprefix(".") or "png")
        tmp.replace(path)
    except (OSError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        raise GptzooError(f"cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)
    return path

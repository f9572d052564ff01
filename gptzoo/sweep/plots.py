"""A sweep's plots (PNG, into the sweep directory): validation loss against the step and against training
FLOPs, every variant overlaid (the mean over seeds), and perplexity against the evaluation length when
the sweep evaluates at several lengths (position encodings: who extrapolates), and the components' balance
by step when the runs logged one (a mixture of experts' expert load: max/mean of its least balanced layer)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gptzoo.hookspecs import STAT_MAX_MEAN
from gptzoo.training.plot import write_figure

VAL_BY_STEP = "val_loss_by_step.png"
VAL_BY_FLOPS = "val_loss_by_flops.png"
PPL_BY_LENGTH = "perplexity_by_length.png"
LOSS_BY_KV = "val_loss_by_kv_bytes.png"


def _mean_curve(runs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """The validation curve averaged over the runs at the steps they all reached."""
    curves = [dict((step, loss) for step, loss in r["val_curve"]) for r in runs if r["val_curve"]]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return [(s, statistics.fmean(c[s] for c in curves)) for s in steps]


def _mean_balance(runs: list[dict[str, Any]], name: str) -> list[tuple[int, float]]:
    """The least balanced layer's ``name`` by step (gptzoo.sweep.runner's balance_curve), averaged over the runs
    at the steps they all logged."""
    curves = [
        dict((step, v) for step, v in r["balance_curve"][name]) for r in runs if r.get("balance_curve", {}).get(name)
    ]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return [(s, statistics.fmean(c[s] for c in curves)) for s in steps]


@contextmanager
def _figure(path: Path, xlabel: str, ylabel: str, title: str) -> Iterator[Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        write_figure(fig, path, "png", "free some space and run `gptzoo plot SWEEP_DIR` again")
    finally:
        plt.close(fig)


def plot_sweep(out: Path, report: dict[str, Any]) -> list[Path]:
    """Draw the report's plots into ``out``; the files written."""
    by_variant = {
        row["variant"]: [r for r in report["runs"] if r["variant"] == row["variant"]] for row in report["variants"]
    }
    curves = {name: _mean_curve(runs) for name, runs in by_variant.items()}
    written = []
    if any(curves.values()):
        with _figure(
            out / VAL_BY_STEP, "step", "validation loss (nats per token)", f"{report['sweep']}: validation loss"
        ) as ax:
            for name, curve in curves.items():
                if curve:
                    ax.plot(*zip(*curve, strict=True), label=name, marker="o", markersize=2)
        written.append(out / VAL_BY_STEP)
        with _figure(
            out / VAL_BY_FLOPS,
            "training FLOPs",
            "validation loss (nats per token)",
            f"{report['sweep']}: loss by compute",
        ) as ax:
            for name, curve in curves.items():
                if curve:
                    run = by_variant[name][0]
                    per_step = run["train_flops_per_token"] * run["tokens_per_step"]
                    ax.plot(
                        [s * per_step for s, _ in curve], [v for _, v in curve], label=name, marker="o", markersize=2
                    )
            ax.set_xscale("log")
        written.append(out / VAL_BY_FLOPS)
    for name in sorted({n for runs in by_variant.values() for r in runs for n in r.get("balance_curve", {})}):
        balance = {variant: _mean_balance(runs, name) for variant, runs in by_variant.items()}
        with _figure(
            out / f"{name}_by_step.png",
            "step",
            f"{name.removesuffix(STAT_MAX_MEAN)} max / mean, least balanced layer",
            f"{report['sweep']}: balance (1 = even)",
        ) as ax:
            for variant, curve in balance.items():
                if curve:
                    ax.plot(*zip(*curve, strict=True), label=variant, linewidth=1)
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        written.append(out / f"{name}_by_step.png")
    kv = [(row["kv_bytes_per_token"], row["final_val_loss"], row["variant"]) for row in report["variants"]]
    kv = [(b, loss["mean"], name) for b, loss, name in kv if loss is not None]
    if len({b for b, _, _ in kv}) > 1:  # the variants' caches differ (e.g. MHA / GQA / MQA): quality against memory
        with _figure(
            out / LOSS_BY_KV,
            "KV cache bytes per token",
            "final validation loss",
            f"{report['sweep']}: loss by KV cache",
        ) as ax:
            for b, loss, name in kv:
                ax.scatter([b], [loss], label=name)
            ax.set_xscale("log", base=2)
        written.append(out / LOSS_BY_KV)
    lengths = sorted({e["length"] for row in report["variants"] for e in row["lengths"]})
    if len(lengths) > 1:
        with _figure(
            out / PPL_BY_LENGTH, "evaluation length (tokens)", "perplexity", f"{report['sweep']}: length extrapolation"
        ) as ax:
            for row in report["variants"]:
                points = [(e["length"], e["perplexity"]["mean"]) for e in row["lengths"] if e["perplexity"] is not None]
                if points:
                    ax.plot(*zip(*points, strict=True), label=row["variant"], marker="o")
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
        written.append(out / PPL_BY_LENGTH)
    return written

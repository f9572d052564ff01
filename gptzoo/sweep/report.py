"""A sweep's report: per variant, over its seeds, what it costs and how well it learned; written as
``report.json`` (every run's result too) and ``report.md`` (the table, the machine, the plots), and
shown as a rich table."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gptzoo.errors import GptzooError, terminal_text
from gptzoo.hookspecs import STAT_MAX_MEAN
from gptzoo.sweep.names import RESULTS, SPIKE
from gptzoo.sweep.spec import SweepSpec
from gptzoo.tables import WholeWords
from gptzoo.training import run_dir

REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def read_results(out: Path) -> list[dict[str, Any]]:
    """Every run's result under ``out``/results."""
    results = []
    for path in sorted((out / RESULTS).glob("*/seed-*.json")):
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise GptzooError(f"cannot read the run result {path} ({exc}); remove it and resume the sweep") from None
    return results


def summarize(results: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """One row per variant (in ``order``) over its seeds."""
    rows = []
    for name in order:
        runs = [r for r in results if r["variant"] == name]
        if not runs:
            continue
        done = [r for r in runs if r["status"] == "done"]
        first = runs[0]
        evals: dict[int, list[dict[str, Any]]] = {}
        for r in done:
            for s in r["eval"] or []:
                evals.setdefault(s["length"], []).append(s)
        lengths = []
        for length, scores in sorted(evals.items()):
            refused = next((s["refused"] for s in scores if s["refused"]), None)
            lengths.append(
                {
                    "length": length,
                    "refused": refused,
                    "perplexity": _spread([s["perplexity"] for s in scores if s["perplexity"] is not None]),
                    "bits_per_byte": _spread([s["bits_per_byte"] for s in scores if s["bits_per_byte"] is not None]),
                }
            )
        reached = [r["steps_to_target"] for r in done if r["steps_to_target"] is not None]
        balance: dict[str, dict[str, float]] = {}
        for stat in sorted({n for r in done for n in r.get("balance", {})}):
            paths = sorted({p for r in done for p in r["balance"].get(stat, {})})
            balance[stat] = {
                p: statistics.fmean(r["balance"][stat][p] for r in done if p in r["balance"].get(stat, {}))
                for p in paths
            }
        rows.append(
            {
                "variant": name,
                "seeds": [r["seed"] for r in runs],
                "params": first["params"],
                "active_params": first.get("active_params", first["params"]),
                "balance": balance,
                "train_flops_per_token": first["train_flops_per_token"],
                "kv_bytes_per_token": first["kv_bytes_per_token"],
                "state_bytes_per_sequence": first.get("state_bytes_per_sequence", 0),  # a record of before contract 8
                "matched": first["matched"],
                "tokens_per_s": _spread([r["tokens_per_s"] for r in runs if r["tokens_per_s"] is not None]),
                "final_val_loss": _spread([r["final_val_loss"] for r in done if r["final_val_loss"] is not None]),
                "best_val_loss": _spread([r["best_val_loss"] for r in done if r["best_val_loss"] is not None]),
                "bits_per_byte": lengths[0]["bits_per_byte"] if lengths else None,
                "lengths": lengths,
                "steps_to_target": _spread([float(s) for s in reached]),
                "reached_target": f"{len(reached)}/{len(runs)}",
                "max_grad_norm": max(
                    (r["max_grad_norm"] for r in runs if r["max_grad_norm"] is not None), default=None
                ),
                "max_spike": max(r["max_spike"] for r in runs),
                "diverged": sum(1 for r in runs if r["status"] == "diverged"),
                "reasons": sorted({r["reason"] for r in runs if r["reason"]}),
            }
        )
    return rows


def _pm(spread: dict[str, float] | None, spec: str = ".4f") -> str:
    """``mean±std`` (the spread without its leading zero: 2.417±.007), or the mean of one."""
    if spread is None:
        return "-"
    if not spread["std"]:
        return f"{spread['mean']:{spec}}"
    std = f"{spread['std']:{spec}}"
    return f"{spread['mean']:{spec}}±{std[1:] if std.startswith('0.') else std}"


def _si(n: float) -> str:
    """Three significant digits and a unit: 842k, 5.70M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}" if n / size < 100 else f"{n / size:.0f}{unit}"
    return f"{n:.0f}"


COLUMNS = (
    "variant",
    "params",
    "FLOPs/token",
    "KV bytes/token",
    "tok/s",
    "final val loss",
    "best val loss",
    "bits/byte",
    "max ‖g‖",
    "diverged",
)


NARROW_OPTIONAL = ("max ‖g‖", "FLOPs/token", "params", "active")
"""The columns a terminal too narrow for whole variant names goes without, the first first (report.md has them)."""


def sparse(rows: list[dict[str, Any]]) -> bool:
    """Whether some variant uses fewer parameters per token than it has (a mixture of experts)."""
    return any(row.get("active_params", row["params"]) != row["params"] for row in rows)


def stateful(rows: list[dict[str, Any]]) -> bool:
    """Whether some variant keeps a constant-size state per sequence (a recurrent or convolutional mixer)."""
    return any(row.get("state_bytes_per_sequence", 0) for row in rows)


def balanced(rows: list[dict[str, Any]]) -> list[str]:
    """The statistics whose balance (max/mean) some variant logged: gptzoo.training.stats."""
    return sorted({name for row in rows for name in row.get("balance", {})})


def worst(row: dict[str, Any], name: str) -> float | None:
    """A variant's final balance of ``name`` at its least balanced component (mean over seeds)."""
    values = row.get("balance", {}).get(name, {}).values()
    return max(values) if values else None


def table_rows(
    rows: list[dict[str, Any]], target: float | None, loss: str = ".4f"
) -> tuple[tuple[str, ...], list[list[str]]]:
    """Column names and cells for the table (as text), losses formatted with ``loss``; an ``active`` column
    when some variant is sparse, and a ``max/mean`` one per statistic whose balance a variant logged."""
    names = balanced(rows)
    active, state = sparse(rows), stateful(rows)
    columns = list(COLUMNS[:2]) + (["active"] if active else []) + list(COLUMNS[2:4])
    columns += (["state bytes/seq"] if state else []) + list(COLUMNS[4:-1])
    columns += [f"{name.removesuffix(STAT_MAX_MEAN)} max/mean" for name in names]
    columns += (["to target"] if target is not None else []) + list(COLUMNS[-1:])
    cells = []
    for row in rows:
        matched = row["matched"]
        name = row["variant"] + (f" ({matched['key'].removeprefix('model.')}={matched['value']})" if matched else "")
        line = [name, _si(row["params"])]
        if active:
            line.append(_si(row.get("active_params", row["params"])))
        line += [_si(row["train_flops_per_token"]), _si(row["kv_bytes_per_token"])]
        if state:
            line.append(_si(row.get("state_bytes_per_sequence", 0)))
        line += [
            _si(row["tokens_per_s"]["mean"]) if row["tokens_per_s"] else "-",
            _pm(row["final_val_loss"], loss),
            _pm(row["best_val_loss"], loss),
            _pm(row["bits_per_byte"], loss),
            f"{row['max_grad_norm']:.2f}" if row["max_grad_norm"] is not None else "-",
        ]
        line += ["-" if (w := worst(row, n)) is None else f"{w:.2f}" for n in names]
        if target is not None:
            reached = row["steps_to_target"]
            line.append(
                f"{reached['mean']:.0f} ({row['reached_target']})" if reached else f"- ({row['reached_target']})"
            )
        line.append(f"{row['diverged']}/{len(row['seeds'])}" + (" ⚠" if row["max_spike"] > SPIKE else ""))
        cells.append(line)
    return tuple(columns), cells


def length_table(rows: list[dict[str, Any]]) -> tuple[list[int], list[list[str]]] | None:
    """Perplexity by evaluation length, when the sweep evaluates at more than one."""
    lengths = sorted({entry["length"] for row in rows for entry in row["lengths"]})
    if len(lengths) < 2:
        return None
    cells = []
    for row in rows:
        by = {e["length"]: e for e in row["lengths"]}
        line = [row["variant"]]
        for n in lengths:
            e = by.get(n)
            line.append("-" if e is None else "refused" if e["refused"] else _pm(e["perplexity"], ".2f"))
        cells.append(line)
    return lengths, cells


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def write_report(spec: SweepSpec, out: Path, *, seconds: float | None = None) -> dict[str, Any]:
    """report.json, report.md and the plots in ``out``; the report."""
    from gptzoo.sweep.plots import plot_sweep

    order = [v.name for v in spec.variants]
    results = sorted(read_results(out), key=lambda r: (order.index(r["variant"]), r["seed"]))
    rows = summarize(results, order)
    report = {
        "sweep": spec.name,
        "description": spec.description,
        "spec": spec.source,
        "budget": {spec.budget[0]: spec.budget[1]},
        "seeds": list(spec.seeds),
        "target_loss": spec.target_loss,
        "machine": machine(),
        "seconds": seconds,
        "variants": rows,
        "runs": results,
    }
    run_dir.write_text_atomically(out / REPORT_JSON, json.dumps(report, indent=1) + "\n")
    plots = plot_sweep(out, report)
    report["plots"] = [p.name for p in plots]
    run_dir.write_text_atomically(out / REPORT_MD, markdown(report))
    return report


def replot(out: Path) -> list[Path]:
    """Draw the plots of a finished sweep again from its report.json.

    Raises:
        GptzooError: the sweep has no report yet, or nothing in it to plot (no run logged a validation loss).
    """
    from gptzoo.sweep.plots import plot_sweep

    try:
        report = json.loads((out / REPORT_JSON).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GptzooError(
            f"{out} has no {REPORT_JSON} yet: finish the sweep first (gptzoo sweep SPEC --out {out} --resume)"
        ) from None
    except (OSError, ValueError) as exc:
        raise GptzooError(f"cannot read {out / REPORT_JSON} ({exc}); run the sweep again with --resume") from None
    written = plot_sweep(out, report)
    if not written:
        raise GptzooError(
            f"{out} has nothing to plot: no run of the sweep logged a validation loss; {out / 'report.md'} says "
            "why each ended (one that diverged: try a lower train.lr)"
        )
    return written


def _md_table(columns: tuple[str, ...] | list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in cells]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    rows = report["variants"]
    columns, cells = table_rows(rows, report["target_loss"])
    m = report["machine"]
    took = f", {report['seconds'] / 60:.1f} minutes" if report["seconds"] else ""
    parts = [
        f"# Sweep {report['sweep']}",
        report["description"],
        f"Budget {', '.join(f'{k} {v:g}' for k, v in report['budget'].items())} per run, seeds "
        f"{', '.join(map(str, report['seeds']))}; {m['cpu']}, {m['cores']} cores, torch {m['torch']}{took}.",
        "Mean±standard deviation over seeds; FLOPs per token for training (forward + backward); KV bytes per token "
        "of the attention cache in float32 at the training length; final and best "
        "validation loss in nats per token; bits per byte from `gptzoo eval` on the validation split at the first "
        "evaluation length; max ‖g‖: the largest gradient norm before clipping; ⚠: a training loss spike of more "
        f"than {SPIKE:g} nat; diverged: a non-finite loss, or a final validation loss {SPIKE:g} nat above the best."
        + (" active: the parameters one token uses (a mixture of experts: k of its E experts)." if sparse(rows) else "")
        + (
            " state bytes/seq: what a sequence's recurrent and convolutional mixers keep in float32 whatever its "
            "length (the KV bytes per token leave it out)."
            if stateful(rows)
            else ""
        )
        + (
            " max/mean: the least balanced layer's share (expert load: the fraction of the tokens' choices per "
            "expert), its largest entry over its mean over the last tenth of the run; 1.00 is perfectly even."
            if balanced(rows)
            else ""
        ),
        _md_table(columns, cells),
    ]
    lengths = length_table(report["variants"])
    if lengths is not None:
        parts += [
            "Perplexity by evaluation length (tokens):",
            _md_table(["variant", *map(str, lengths[0])], lengths[1]),
        ]
    reasons = notes(report)
    if reasons:
        parts.append("\n".join(f"- {name}: {r}" for name, r in reasons))
    parts += [f"![{p}]({p})" for p in report.get("plots", [])]
    return "\n\n".join(p for p in parts if p) + "\n"


def notes(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(variant, note) for each reason a run diverged and each evaluation length a variant refused:
    what the tables' "diverged" and "-" / "refused" cells stand for."""
    reasons = [(row["variant"], r) for row in report["variants"] for r in row["reasons"]]
    return reasons + [
        (row["variant"], f"length {e['length']} refused: {e['refused']}")
        for row in report["variants"]
        for e in row["lengths"]
        if e["refused"]
    ]


def render_report(report: dict[str, Any], out: Console) -> None:
    columns, cells = table_rows(report["variants"], report["target_loss"], loss=".3f")
    drop = {columns.index("best val loss"), columns.index("KV bytes/token")}  # in report.md: the terminal has 80
    columns = tuple(c for i, c in enumerate(columns) if i not in drop)
    cells = [[c for i, c in enumerate(line) if i not in drop] for line in cells]
    table = Table(title=f"sweep {escape(terminal_text(report['sweep']))}", title_justify="left")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    for line in cells:  # a mean and its spread may fold between them, never inside either
        table.add_row(*(escape(c).replace("±", " ±") for c in line))
    out.print(WholeWords(table, optional=NARROW_OPTIONAL))
    lengths = length_table(report["variants"])
    if lengths is not None:
        t = Table(title="perplexity by evaluation length", title_justify="left")
        t.add_column("variant", overflow="fold")
        for n in lengths[0]:
            t.add_column(str(n), justify="right", overflow="fold")
        for line in lengths[1]:  # as above: a perplexity and its spread may fold between them
            t.add_row(*(escape(c).replace("±", " ±") for c in line))
        out.print(WholeWords(t))
    for name, note in notes(report):  # what a "diverged" count or a "-" / "refused" cell stands for
        out.print(f"[yellow]{escape(terminal_text(name))}:[/yellow] {escape(terminal_text(note))}")

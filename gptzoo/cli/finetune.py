"""``gptzoo finetune``: LoRA or DoRA adapters of any MODEL trained on a frozen base, saved in peft's format."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gptzoo.cli.args import Parser, Subparsers, add_offline, add_set, finite_float, integer
from gptzoo.cli.console import Console, print_json, status
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.model import MODEL_HELP
from gptzoo.cli.render import text
from gptzoo.errors import GptzooError

if TYPE_CHECKING:
    from torch import nn

    from gptzoo.adapters.targets import Part


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "finetune",
        parents=[common],
        help="train LoRA / DoRA adapters of a model on a frozen base; saved in peft's format",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "--data",
        metavar="FILE|DIR",
        help='a text (.txt, .md) or JSON Lines file (a "text", or "prompt" and "completion", a line), or a '
        "`gptzoo prepare` directory; a resumed run reuses its own",
    )
    p.add_argument("--out", metavar="DIR", help="the run directory (default: runs/finetune)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument(
        "--targets",
        metavar="T1,T2",
        help="the projections to adapt, by the components' names (q,k,v,o,gate,up,down, or attn.q...; all: every "
        "one); default: q,v. --list-targets shows them",
    )
    p.add_argument("--list-targets", action="store_true", help="list the projections MODEL offers, then stop")
    p.add_argument("--lora-rank", type=integer, default=8, metavar="R", help="the adapters' rank (default 8)")
    p.add_argument("--lora-alpha", type=finite_float, default=16.0, metavar="A", help="scale alpha/r (default 16)")
    p.add_argument("--lora-dropout", type=finite_float, default=0.0, metavar="P", help="dropout on the adapters' input")
    p.add_argument("--dora", action="store_true", help="weight-decomposed LoRA (DoRA; peft's use_dora)")
    p.add_argument("--rslora", action="store_true", help="rank-stabilized scaling alpha/sqrt(r) (peft's use_rslora)")
    add_set(p, "set a [train] key, e.g. train.max_steps=30 (fine-tuning's defaults: lr 2e-4, 100 steps)")
    add_offline(p)
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.adapters.lora import LoRASpec
        from gptzoo.finetune import finetune, load_for_finetune, targets_table
        from gptzoo.training.display import TrainDisplay, start_line, timed_line
        from gptzoo.training.trainer import Plan

    registry = command_registry(err)
    if args.list_targets:
        with status(err, f"loading {args.model}", quiet=args.json):
            model = load_for_finetune(args.model, registry).model
        show_targets(model, targets_table(model, registry), out, as_json=args.json)
        return
    targets = [t.strip() for t in args.targets.split(",") if t.strip()] if args.targets is not None else None
    if targets is not None and not targets:
        raise GptzooError("--targets names no projection; give e.g. q,v (see --list-targets)")
    lora = LoRASpec(args.lora_rank, args.lora_alpha, args.lora_dropout, args.dora, args.rslora)
    run_dir = Path(args.out) if args.out is not None else Path("runs") / "finetune"
    common = {
        "data": args.data,
        "out": run_dir,
        "targets": targets,
        "lora": lora,
        "overrides": args.overrides,
        "resume": args.resume,
        "registry": registry,
        "say": lambda line: err.print(text(line)) if not args.json else None,
    }
    if args.json:
        summary = finetune(args.model, **common)
        print_json(out, summary)
        return
    with TrainDisplay(err, total_steps=0, title=f"finetune {args.model}") as display:

        def planned(plan: Plan) -> None:
            display.planned(plan.steps)
            err.print(text(start_line(plan)))

        summary = finetune(
            args.model,
            **common,
            log=display,
            started=display.start,
            stepped=display.step,
            planned=planned,
            timed=lambda timing: err.print(text(timed_line(timing))),
        )
    before = summary["val_loss_before"]
    change = f"val loss {before:.4f} -> {summary['val_loss']:.4f}" if before is not None and summary["val_loss"] else ""
    out.print(
        f"{summary['steps']} steps, loss {summary['loss']:.4f}; {change}; trained {summary['trainable_parameters']:,} "
        f"of {summary['total_parameters']:,} parameters ({', '.join(summary['targets'])})"
    )
    out.print(f"adapter (peft's format): {text(summary['adapter'])}")
    out.print(
        f"[dim]generate with: gptzoo generate {text(args.model)} --adapter {text(summary['adapter'])} "
        "--prompt TEXT[/dim]"
    )


def show_targets(model: nn.Module, table: dict[str, list[Part]], out: Console, *, as_json: bool) -> None:
    """The table of what MODEL offers --targets (--list-targets)."""
    rows = []
    for name, parts in table.items():
        first = parts[0]
        linear = model.get_submodule(first.linear)
        rows.append(
            {
                "target": name,
                "projection": first.linear.split(".", 2)[2] if first.linear.startswith("blocks.") else first.linear,
                "rows": [first.start, first.stop],
                "shape": [first.stop - first.start, linear.in_features],
                "count": len(parts),
            }
        )
    if as_json:
        print_json(out, {"targets": rows})
        return
    from rich.table import Table

    table_ = Table(title="adapter targets (--targets)")
    for column in ("target", "projection", "rows", "shape", "modules"):
        table_.add_column(column)
    for r in rows:
        table_.add_row(
            r["target"],
            r["projection"],
            f"{r['rows'][0]}:{r['rows'][1]}",
            f"{r['shape'][0]} x {r['shape'][1]}",
            str(r["count"]),
        )
    out.print(table_)

"""``gptzoo sweep``: every variant of an ablation trained, evaluated and reported."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gptzoo.cli.args import Parser, Subparsers, budget, positive_int
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text
from gptzoo.cli.torchrun import first_process
from gptzoo.sweep.names import SWEEPS


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "sweep",
        parents=[common],
        help="train and evaluate every variant of an ablation (a spec), with seeds, then report what each swap did",
    )
    p.add_argument("spec", metavar="SPEC", help="a sweep spec (.toml) or a shipped sweep: " + ", ".join(SWEEPS))
    p.add_argument("--out", metavar="DIR", help="the sweep directory (default: sweeps/SPEC)")
    p.add_argument("--resume", action="store_true", help="finish the sweep in --out: only the runs it lacks")
    p.add_argument(
        "--jobs", type=positive_int, default=1, metavar="N", help="runs at once, each in its own process (default 1)"
    )
    p.add_argument("--data", metavar="DIR", help="prepared data for every run, instead of the spec's [data]")
    p.add_argument(
        "--budget",
        type=budget,
        metavar="KIND=N",
        help="instead of the spec's [budget]: steps=N, tokens=N or flops=N per run (e.g. a short try: steps=20)",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.sweep.display import RunBar
        from gptzoo.sweep.report import render_report
        from gptzoo.sweep.runner import run_sweep
        from gptzoo.sweep.spec import read_spec

    registry = command_registry(err)
    spec = read_spec(args.spec, registry=registry, data=args.data, budget=args.budget)
    target = args.out if args.out is not None else Path("sweeps") / spec.name

    def bar(task: Any, k: int, total: int) -> RunBar:
        return RunBar(err, f"[{k}/{total}] {task.variant} seed {task.seed}", task.recipe.train.max_steps)

    report = run_sweep(
        spec,
        target,
        resume=args.resume,
        jobs=args.jobs,
        registry=registry,
        say=None if args.json or not first_process(args) else (lambda line: err.print(text(line))),
        display=None if args.json or not first_process(args) else bar,
    )
    if report is None:  # under torchrun, not the first process: it reports
        return
    if args.json:
        print_json(out, report)
        return
    render_report(report, out)
    out.print(f"report: {text(str(Path(target) / 'report.md'))}")

"""``gptzoo plot``: a run's loss (and its components' balance: each MoE layer's expert load), or a sweep's plots,
drawn again."""

from __future__ import annotations

import argparse
from pathlib import Path

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import importing
from gptzoo.cli.render import text
from gptzoo.errors import GptzooError
from gptzoo.sweep.names import SWEEP_RECORD


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "plot",
        parents=[common],
        help="draw a run's loss (and each MoE layer's expert load) into a PNG, or a sweep's plots into its directory",
    )
    p.add_argument("run", help="a run directory (`gptzoo train --out`) or a sweep directory (`gptzoo sweep --out`)")
    p.add_argument("--out", metavar="PNG", help="default: RUN/loss.png (a run only)")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.training.plot import plot_run

    if (Path(args.run) / SWEEP_RECORD).is_file():
        with importing():
            from gptzoo.sweep.report import replot

        if args.out is not None:
            raise GptzooError("--out is for a run's plot; a sweep's plots go into its own directory")
        written = replot(Path(args.run))
        if args.json:
            print_json(out, {"png": [str(p) for p in written]})
            return
        for path in written:
            out.print(f"wrote {text(str(path))}")
        return
    png = plot_run(args.run, args.out)
    if args.json:
        print_json(out, {"png": str(png)})
        return
    out.print(f"wrote {text(str(png))}")

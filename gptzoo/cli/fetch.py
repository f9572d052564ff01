"""``gptzoo fetch``: real pretrained weights into the user cache."""

from __future__ import annotations

import argparse

from gptzoo.cli.args import Parser, Subparsers, add_offline
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.render import text
from gptzoo.fetch import FETCHABLE, fetch


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "fetch", parents=[common], help="download and convert real pretrained weights into the user cache"
    )
    p.add_argument("name", help=f"one of: {', '.join(FETCHABLE)}")
    p.add_argument("--force", action="store_true", help="convert again even if already fetched")
    add_offline(p)
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    if args.json:
        path = fetch(args.name, force=args.force)
    elif not err.is_terminal:
        path = fetch(args.name, force=args.force, log=lambda message: err.print(text(message), highlight=False))
    else:  # one display for the whole fetch: each step's line, below it the step running, the
        # conversion's tensors counted, and the time
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=err, transient=True) as progress:
            running = progress.add_task(f"fetching {args.name}", total=None)

            def step(message: str) -> None:  # "done X; doing Y": the line, then Y beside the spinner
                progress.console.print(text(message), highlight=False)
                progress.update(running, description=text(message.partition(";")[2].strip() or message))

            def dequantized(done: int, total: int) -> None:  # the conversion's tensors, on the same line
                progress.update(running, completed=done, total=total)

            path = fetch(args.name, force=args.force, log=step, advance=dequantized)
    if args.json:
        print_json(out, {"name": args.name, "path": str(path)})
        return
    out.print(f"{args.name}: {text(str(path))}")

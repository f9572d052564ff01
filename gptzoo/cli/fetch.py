"""``gptzoo fetch``: real pretrained weights into the user cache."""

from __future__ import annotations

import argparse

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.render import text
from gptzoo.fetch import FETCHABLE, fetch


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "fetch", parents=[common], help="download and convert real pretrained weights into the user cache"
    )
    p.add_argument("name", help=f"one of: {', '.join(FETCHABLE)}")
    p.add_argument("--force", action="store_true", help="convert again even if already fetched")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    path = fetch(args.name, force=args.force, log=(lambda msg: err.print(text(msg))) if not args.json else None)
    if args.json:
        print_json(out, {"name": args.name, "path": str(path)})
        return
    out.print(f"{args.name}: {text(str(path))}")

"""``gptzoo new-plugin``: a new plugin package for one component."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import command_registry
from gptzoo.cli.render import text
from gptzoo.hookspecs import KINDS


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "new-plugin", parents=[common], help="write a new plugin package: a component, its tests, pyproject.toml"
    )
    p.add_argument(
        "name", help="the component's name, e.g. sliding_window (its module: gptzoo_NAME, distribution: gptzoo-NAME)"
    )
    p.add_argument("--kind", required=True, choices=KINDS, help="the kind of component")
    p.add_argument("--out", metavar="DIR", help="a new directory for the package (default: gptzoo-NAME)")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    from gptzoo.scaffold import new_plugin  # its templates: only when it runs

    scaffold = new_plugin(args.name, args.kind, args.out, registry=command_registry(err))
    if args.json:
        print_json(out, {**asdict(scaffold), "directory": str(scaffold.directory), "next": scaffold.next_steps})
        return
    out.print(f"wrote {text(scaffold.directory)}: {text(', '.join(scaffold.files))}")
    out.print(f"next: {text(scaffold.next_steps)}")

"""``gptzoo export``: a gptzoo checkpoint written as a Hugging Face checkpoint."""

from __future__ import annotations

import argparse

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser("export", parents=[common], help="write a gptzoo checkpoint as a Hugging Face checkpoint")
    p.add_argument("checkpoint", help="a gptzoo checkpoint directory (from `gptzoo build --out`)")
    p.add_argument("--hf", required=True, metavar="OUT", help="the new Hugging Face checkpoint directory")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.hf import export_hf
        from gptzoo.model.checkpoint import load_checkpoint

    registry = command_registry(err)
    model = load_checkpoint(args.checkpoint, registry=registry)
    path = export_hf(model, args.hf, tokenizer_from=args.checkpoint, registry=registry)
    if args.json:
        print_json(out, {"hf": str(path)})
        return
    out.print(f"Hugging Face checkpoint written to {text(str(path))}")

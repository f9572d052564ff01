"""``gptzoo build``: what a model is made of and what it costs; with --out, a checkpoint."""

from __future__ import annotations

import argparse

from gptzoo.cli.args import Parser, Subparsers, positive_int, recipe_parser
from gptzoo.cli.console import Console, print_json, status
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "build",
        parents=[common, recipe_parser()],
        help="build a model from a recipe and show what it is made of and costs",
    )
    p.add_argument(
        "--seq-len", type=positive_int, metavar="T", help="sequence length for FLOPs (default: the context length)"
    )
    p.add_argument("--batch", type=positive_int, default=1, metavar="B", help="batch size for FLOPs (default: 1)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write a checkpoint (model.safetensors + recipe.toml) to DIR: initialized, or with --hf's weights",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.loader import build
        from gptzoo.model.summary import render_summary

    registry = command_registry(err)
    name = args.hf if args.hf is not None else args.recipe
    what = f"loading {name} into {args.out}" if args.hf is not None and args.out is not None else f"building {name}"
    with status(err, what, quiet=args.json):
        summary = build(
            args.recipe,
            hf=args.hf,
            overrides=args.overrides,
            batch=args.batch,
            seq_len=args.seq_len,
            out=args.out,
            registry=registry,
        )
    if args.json:
        print_json(out, summary)
        return
    render_summary(summary, out)
    if args.out is not None:
        out.print(f"checkpoint written to {text(summary['checkpoint'])}")

"""``gptzoo export``: a model (a gptzoo checkpoint, a run's newest, any MODEL) written as a Hugging Face checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, print_json, status
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text
from gptzoo.errors import GptzooError


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser("export", parents=[common], help="write a gptzoo checkpoint as a Hugging Face checkpoint")
    p.add_argument(
        "model",
        metavar="MODEL",
        help="the model to export: a gptzoo checkpoint (from `gptzoo build --out`) or run directory (its newest "
        "checkpoint), or any other MODEL (README: Naming a model)",
    )
    p.add_argument("--hf", required=True, metavar="OUT", help="the new Hugging Face checkpoint directory")
    p.add_argument(
        "--adapter", metavar="DIR", help="a LoRA adapter in peft's format to merge into the weights (with --merge)"
    )
    p.add_argument("--merge", action="store_true", help="write the weights with --adapter merged into them")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.hf.convert import export_hf
        from gptzoo.loader import load_any, with_adapter

    if (args.adapter is None) != (not args.merge):
        raise GptzooError(
            "--adapter DIR --merge writes the weights with the adapter merged into them: give both (an adapter is "
            "already in peft's format, which peft and vLLM load beside the base)"
        )
    registry = command_registry(err)
    with status(err, f"loading {args.model}", quiet=args.json):
        loaded = load_any(args.model, registry=registry)
        if args.adapter is not None:
            loaded = with_adapter(loaded, args.adapter, registry, merge=True)
    files = loaded.checkpoint if loaded.checkpoint is not None else loaded.hf_dir  # its tokenizer files, if any
    with status(err, f"converting to {args.hf}", quiet=args.json):
        path = export_hf(loaded.model, args.hf, tokenizer_from=files, registry=registry)
    newest = loaded.checkpoint is not None and loaded.checkpoint.resolve() != Path(args.model).resolve()
    source = f"{loaded.source} (the newest of run {args.model})" if newest else loaded.source
    if args.json:
        print_json(out, {"hf": str(path), "weights": source})
        return
    out.print(f"Hugging Face checkpoint of {text(source)} written to {text(str(path))}")

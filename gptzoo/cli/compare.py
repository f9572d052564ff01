"""``gptzoo compare``: Hugging Face and gptzoo on the same checkpoint and tokens."""

from __future__ import annotations

import argparse

from rich.table import Table

from gptzoo.cli.args import Parser, Subparsers, positive_int
from gptzoo.cli.console import Console, print_json, status
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.model import model_parser, named
from gptzoo.cli.render import text
from gptzoo.defaults import DEFAULT_PROMPT, DTYPE_NAMES
from gptzoo.errors import GptzooError
from gptzoo.tables import WholeWords


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "compare",
        parents=[common, model_parser("override a recipe key, e.g. model.n_layer=6")],
        help="run Hugging Face and gptzoo on the same checkpoint and tokens",
    )
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32")
    p.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="TEXT",
        help=f"a prompt (repeatable; default: {DEFAULT_PROMPT!r})",
    )
    p.add_argument(
        "--new-tokens", type=positive_int, default=32, metavar="N", help="greedy tokens to compare (default: 32)"
    )
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.adapters.peft_format import PeftSides
        from gptzoo.hf.compare import compare
        from gptzoo.loader import resolve_recipe
        from gptzoo.model.summary import DTYPES

    registry = command_registry(err)
    model = named(args, registry)
    if model.checkpoint is not None:
        raise GptzooError(
            f"compare runs transformers on a Hugging Face checkpoint, and --checkpoint {model.checkpoint} is a gptzoo "
            f"one: export it (gptzoo export {model.checkpoint} --hf DIR) and compare DIR"
        )
    hf = model.hf if model.name is None else model.name  # any other MODEL is a Hugging Face checkpoint's name
    recipe, source = resolve_recipe(model.recipe, hf=hf, overrides=args.overrides, registry=registry, need_weights=True)
    with status(err, f"comparing {source} with transformers (both models loaded and run)", quiet=args.json):
        result = compare(
            source,
            recipe,
            prompts=args.prompt or [DEFAULT_PROMPT],
            dtype=DTYPES[args.dtype],
            new_tokens=args.new_tokens,
            chat=args.chat,
            registry=registry,
            adapter=None if args.adapter is None else PeftSides.given(args.adapter),
        )
    if args.json:
        print_json(out, result)
        return
    sides = (
        "gptzoo vs Hugging Face" if args.adapter is None else f"gptzoo vs Hugging Face + peft, both with {args.adapter}"
    )
    title = f"{result['recipe']}: {sides}, {result['dtype']}, {result['new_tokens']} greedy tokens"
    table = Table(title=text(title), title_justify="left")
    for col in ("prompt", "tokens", "max |dlogit|", "mean |dlogit|", "top-1", "KL(HF||gptzoo)", "greedy"):
        table.add_column(col, overflow="fold")
    for row in result["prompts"]:
        prompt = row["prompt"] if isinstance(row["prompt"], str) else f"{len(row['prompt'])} token ids"
        table.add_row(
            text(prompt),
            str(row["n_tokens"]),
            f"{row['max_abs_diff']:.2e}",
            f"{row['mean_abs_diff']:.2e}",
            f"{row['top1_agreement']:.1%}",
            f"{row['kl_hf_gptzoo']:.2e}",
            "[green]same[/green]" if row["greedy_match"] else "[red]differs[/red]",
        )
    out.print(WholeWords(table))
    for row in result["prompts"]:
        if "gptzoo_text" in row:
            out.print(f"[bold]gptzoo:[/bold] {text(row['gptzoo_text'])}")
            if not row["greedy_match"]:
                out.print(f"[bold]HF:[/bold]     {text(row['hf_text'])}")

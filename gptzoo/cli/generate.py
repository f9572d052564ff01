"""``gptzoo generate``: text from a model, with the sampler flags of the registered samplers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gptzoo.cli.args import (
    MAX_SEED,
    Parser,
    Subparsers,
    finite_float,
    integer,
    positive_int,
    sampler_step,
    seed,
)
from gptzoo.cli.console import Console, print_json, warn, write_text
from gptzoo.cli.library import importing
from gptzoo.cli.model import load_named, model_parser
from gptzoo.cli.render import text
from gptzoo.defaults import PRECISIONS
from gptzoo.errors import PluginError
from gptzoo.registry import GPTZOO_DISTRIBUTION, Registry, culprit

if TYPE_CHECKING:
    from gptzoo.inference.paths import DecodePath


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "generate",
        parents=[common, model_parser("override a recipe key, e.g. model.n_layer=6")],
        help="generate text from a recipe, Hugging Face weights or a checkpoint",
    )
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        metavar="TEXT",
        help="a prompt (repeatable: prompts run as one batch)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        metavar="N",
        help="default: the recipe's [generate] max_new_tokens (128)",
    )
    p.add_argument(
        "--sampler",
        dest="samplers",
        action="append",
        default=[],
        type=sampler_step,
        metavar="NAME[:K=V,...]",
        help="add a registered sampler step, or set the parameters of the chain's one, e.g. top_k:k=40 "
        "(repeatable; values are TOML: 0.9, 3, true, 'text'; see `gptzoo list sampler`)",
    )
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end a row's text at this string (repeatable)"
    )
    p.add_argument(
        "--seed",
        type=seed,
        metavar="S",
        help=f"0..{MAX_SEED}: make sampling (and random weights, when a recipe has none) reproducible",
    )
    p.add_argument(
        "--dtype",
        choices=tuple(PRECISIONS),
        default="float32",
        help="int8: every Linear layer's weights in int8 (a float32 scale per row), int4: in llama.cpp's Q4_1 blocks "
        "(32 4-bit weights, a float16 scale and minimum) and the output head in int8; the rest in float32",
    )
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.inference.generate import plan_generation
        from gptzoo.inference.sampling import flagged

    registry = args.registry  # built once, before the command line was parsed (it has the sampler flags)
    loaded = load_named(args, registry, dtype=args.dtype, seed=args.seed, random=True, err=err)
    sampling = {entry.name: getattr(args, flag_dest(entry.name)) for entry, _ in flagged(registry)}
    plan = plan_generation(
        loaded.model,
        loaded.tokenizer(),
        args.prompt,
        registry=registry,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        samplers=args.samplers,
        seed=args.seed,
        stop=args.stop,
    )
    for warning in (*loaded.warnings, *([plan.note] if plan.note else [])):
        warn(err, warning)
    stream = None
    if not args.json and len(plan.prompts) == 1:
        err.print(f"[dim]sampler: {text(plan.sampler.describe())}[/dim]")
        write_text(out, args.prompt[0] + ("\n" if args.chat else ""))

        def stream(row: int, text: str) -> None:
            write_text(out, text)

    paths: list[DecodePath] = []  # the decoding path, reported once the prompts are in the cache
    try:
        results, tokens_per_s = plan.run(stream, on_decode_path=paths.append)
    except KeyboardInterrupt:
        if stream is not None:
            write_text(out, "\n")  # end the streamed line before the message
        raise
    if args.json:
        print_json(
            out,
            {
                "text": [r.text for r in results],
                "tokens": [r.tokens for r in results],
                "finish_reasons": [r.finish_reason for r in results],
                "tokens_per_s": tokens_per_s,
                "max_new_tokens": plan.max_new_tokens,
                "note": plan.note,
                "sampler": [{"name": name, **params} for name, params in plan.sampler.spec],
                "sampler_chain": plan.sampler.describe(),
                "decode": paths[0].as_json() if paths else None,
                "recipe": loaded.recipe.name,
            },
        )
        return
    if stream is not None:
        write_text(out, "\n")
        err.print(f"[dim]({results[0].finish_reason}, {len(results[0].tokens)} tokens)[/dim]")
    else:
        err.print(f"[dim]sampler: {text(plan.sampler.describe())}[/dim]")
        for prompt, r in zip(args.prompt, results, strict=True):
            write_text(out, f"{prompt}{r.text}\n")
            out.print(f"[dim]({r.finish_reason}, {len(r.tokens)} tokens)[/dim]")
    if paths and paths[0].message:
        err.print(f"[yellow]note:[/yellow] {text(paths[0].message)}")
    err.print(f"[dim]{tokens_per_s:.1f} tokens/s[/dim]")


def flag_dest(name: str) -> str:
    return f"sampler flag {name}"


def add_sampler_flags(parser: argparse.ArgumentParser, registry: Registry) -> None:
    """One flag per registered sampler that declares one (gptzoo.interfaces.SamplerFlag)."""
    from gptzoo.inference.sampling import flagged, option

    group = parser.add_argument_group(
        "sampler flags", "each sets a sampler step's parameter, inserted in Hugging Face's order if the chain lacks it"
    )
    steps = flagged(registry)
    for entry, _ in steps:
        same = [culprit(other) for other, _ in steps if option(other.name) == option(entry.name)]
        if len(same) > 1:
            raise PluginError(
                f"{' and '.join(same)} declare the same flag {option(entry.name)}; rename one of the samplers "
                "(each stays usable as --sampler)"
            )
    for entry, flag in steps:
        source = "" if entry.provenance.distribution == GPTZOO_DISTRIBUTION else f" (from {entry.provenance})"
        try:
            group.add_argument(
                option(entry.name),
                dest=flag_dest(entry.name),
                type=integer if flag.type is int else finite_float,
                metavar=flag.param.upper(),
                help=escape_help(flag.help) + source,
            )
        except argparse.ArgumentError:
            raise PluginError(
                f"{culprit(entry)} declares the flag {option(entry.name)}, which gptzoo generate already has; "
                "rename the sampler (it stays usable as --sampler)"
            ) from None


def unflagged_hint(registry: Registry, argv: Sequence[str]) -> str:
    """For ``--ban`` where sampler ``ban`` has no flag: how to give it instead; else ``""``."""
    from gptzoo.inference.sampling import flagged, option

    unflagged = {option(e.name): e.name for e in registry.entries("sampler")} | {
        option(e.name): None for e, _ in flagged(registry)
    }
    for arg in argv:
        name = unflagged.get(arg.partition("=")[0])
        if name is not None:
            return f" (sampler {name!r} has no flag of its own: give it as --sampler {name}:PARAM=VALUE)"
    return ""


def escape_help(text: str) -> str:
    """A plugin's help line as argparse shows it literally (it formats '%')."""
    return text.replace("%", "%%")

"""Naming a model, the same way for every command that takes one (``generate``, ``compare``, ``eval``):
MODEL, which :func:`gptzoo.loader.load_any` resolves (a checkpoint or run directory, a Hugging Face
directory, a fetchable or hub name) unless it names a recipe, or the flags ``--hf DIR|NAME`` and
``--checkpoint DIR``. A recipe is the one MODEL that goes with ``--hf``: the recipe those weights must
fit. README.md, "Naming a model", lists the forms. (``export`` takes MODEL alone: its ``--hf`` is the
directory it writes.)
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptzoo.cli.args import Parser, add_offline, add_set
from gptzoo.cli.console import Console, status
from gptzoo.defaults import BY_NAME
from gptzoo.errors import GptzooError

if TYPE_CHECKING:
    from gptzoo.loader import Loaded
    from gptzoo.registry import Registry

MODEL_HELP = (
    "a recipe (a shipped name or a .toml file), a gptzoo checkpoint or run directory (its newest checkpoint), a "
    "Hugging Face directory, or a name `gptzoo fetch` or the local Hugging Face cache knows (README: Naming a model)"
)


def model_parser(overrides: str, *, several_adapters: bool = False) -> Parser:
    """The parent parser of a command that takes a model: MODEL, ``--hf``, ``--checkpoint``, ``--adapter``
    (repeatable with ``several_adapters``: a list) and ``--set`` (``overrides`` says what it may change,
    with an example)."""
    parser = Parser(add_help=False)
    parser.add_argument("model", nargs="?", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--hf",
        metavar="DIR|NAME",
        help="MODEL as a Hugging Face checkpoint: a directory, a name `gptzoo fetch` knows, or a hub name in the "
        "local HF cache; beside a recipe MODEL, the weights that recipe must fit",
    )
    parser.add_argument("--checkpoint", metavar="DIR", help="MODEL as a gptzoo checkpoint directory")
    if several_adapters:
        parser.add_argument(
            "--adapter",
            action="append",
            metavar="[NAME=]DIR",
            help="a LoRA adapter in peft's format (a directory peft or `gptzoo finetune` wrote): NAME=DIR is served as "
            "the model NAME beside MODEL, DIR alone in MODEL's place (repeatable)",
        )
    else:
        parser.add_argument(
            "--adapter",
            metavar="[NAME=]DIR",
            help="a LoRA adapter in peft's format (a directory peft or `gptzoo finetune` wrote), computed as peft's "
            "unmerged layers compute it",
        )
    add_set(parser, overrides)
    add_offline(parser)
    return parser


@dataclass(frozen=True)
class Named:
    """What the command line names: a recipe (MODEL, when it names one), another MODEL (for load_any),
    ``--hf`` and ``--checkpoint``."""

    recipe: str | None
    name: str | None
    hf: str | None
    checkpoint: str | None


def named(args: argparse.Namespace, registry: Registry) -> Named:
    """MODEL, ``--hf`` and ``--checkpoint`` as the command line gives them (MODEL a recipe when it is a
    .toml file or a recipe's name, shipped or one a plugin of ``registry`` registers).

    Raises:
        GptzooError: no model at all, or a MODEL other than a recipe beside ``--hf`` or ``--checkpoint``.
    """
    from gptzoo.loader import names_recipe

    model, flags = args.model, (("--hf", args.hf), ("--checkpoint", args.checkpoint))
    if model is None and args.hf is None and args.checkpoint is None:
        raise GptzooError(
            "name the model: MODEL (a recipe, a checkpoint or run directory, a Hugging Face directory or a fetchable "
            "name), --hf DIR|NAME or --checkpoint DIR"
        )
    if model is not None and names_recipe(model, registry):
        return Named(model, None, args.hf, args.checkpoint)
    for flag, value in flags:
        if model is not None and value is not None:
            raise GptzooError(
                f"{model!r} and {flag} {value!r} both name the model; give one of them (beside --hf, MODEL may "
                "only be a recipe: the one its weights must fit)"
            )
    return Named(None, model, args.hf, args.checkpoint)


def load_named(
    args: argparse.Namespace,
    registry: Registry,
    *,
    dtype: str,
    seed: int | None = None,
    random: bool = False,
    err: Console | None = None,
) -> Loaded:
    """The model the command line names (:func:`named`), with its ``--set`` overrides, in the precision
    ``dtype`` (``--dtype``, passed down as it is): MODEL through :func:`gptzoo.loader.load_any`, ``--hf``
    and ``--checkpoint`` (beside a recipe or not) through :func:`gptzoo.loader.load_model`. A recipe alone
    is read for its [weights] (load_any), or with ``random`` may have none: then its weights are random,
    reproducibly with ``seed``, and the Loaded warns of it. A slow load says so on ``err`` (not with --json).

    Raises:
        GptzooError: as :func:`named`, load_any and load_model do.
    """
    from gptzoo.loader import load_any, load_model, with_adapter, with_precision

    model = named(args, registry)
    adapter = getattr(args, "adapter", None)
    weights = None if adapter is not None else dtype  # an adapter merges into the float32 weights first
    shown = " ".join(str(n) for n in (model.recipe, model.name, model.hf, model.checkpoint) if n is not None)
    chosen = BY_NAME.get(dtype)
    doing = f"loading {shown}" + (f" and quantizing it to {dtype}" if chosen is not None and chosen.quantized else "")
    with nullcontext() if err is None else status(err, doing, quiet=args.json):
        if model.hf is None and model.checkpoint is None and not (random and model.recipe is not None):
            source = model.recipe if model.recipe is not None else model.name
            loaded = load_any(source, overrides=args.overrides, registry=registry, dtype=weights)
        else:
            loaded = load_model(
                model.recipe,
                hf=model.hf,
                checkpoint=model.checkpoint,
                overrides=args.overrides,
                registry=registry,
                dtype=weights,
                seed=seed,
            )
        if adapter is None:
            return loaded
        return with_precision(with_adapter(loaded, adapter, registry), dtype, registry)

"""The ``gptzoo`` command: rich tables for people, ``--json`` for machines.

Each command parses its flags, calls the library and renders the result. User errors (and usage
errors) print one message on stderr and exit with status 2; Ctrl-C prints ``interrupted`` (and what
was kept) and exits with status 130; ``--debug`` also prints the traceback. With ``--json``, stdout
holds one JSON document: the result, or ``{"error": MESSAGE, "exit": STATUS}`` (anything else that
writes to stdout meanwhile, a plugin's print say, goes to stderr). Anything else is a bug and keeps
its traceback (status 1).

Parsing imports nothing heavy: each command imports the library modules it calls (torch, transformers)
when it runs, so ``--help``, ``recipes``, ``list`` and ``plugins`` import neither.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tomllib
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gptzoo import catalog
from gptzoo.defaults import DEFAULT_PROMPT, DTYPE_NAMES, GENERATE_DTYPES, SEED_LIMIT
from gptzoo.errors import GptzooError, Interrupted, PluginError, exception_text, terminal_text
from gptzoo.fetch import FETCHABLE, fetch
from gptzoo.hookspecs import KINDS
from gptzoo.plugin_manager import canonical_name, gptzoo_version
from gptzoo.recipe import load_recipe, read_recipe_data, shipped_recipes
from gptzoo.recipe.schema import MAX_DIM
from gptzoo.registry import GPTZOO_DISTRIBUTION, Registry, culprit, get_registry, split_name
from gptzoo.scaffold import new_plugin
from gptzoo.sweep.names import BUDGETS, SWEEP_RECORD, SWEEPS
from gptzoo.training.corpora import CORPORA, DEFAULT_VAL_FRACTION, NAMED_TOKENIZERS

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away
MAX_SEED = SEED_LIMIT - 1
TORCHRUN_COMMANDS = ("train", "sweep")
"""The commands that run in every process of a torchrun launch (the first one reports)."""
MAX_COUNT = MAX_DIM
"""The largest --batch, --seq-len, --max-new-tokens and --new-tokens."""


class UsageError(Exception):
    """A command line argparse refuses (raised instead of argparse's exit, so --json can report it)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(f"{parser.prog}: {message}")
        self.parser, self.message = parser, message


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)  # --js is not --json: scripts spell flags out

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def _cut(text: str) -> str:
    """A flag's value for a message, long values cut."""
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} is not an integer") from None


def _positive_int(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{_cut(text)} must be between 1 and {MAX_COUNT}")
    return value


def _lengths(text: str) -> list[int]:
    """Comma-separated positive integers: --lengths 128,256,512."""
    values = [_positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} names no length; give e.g. 128,256,512")
    return sorted(set(values))


def _budget(text: str) -> tuple[str, float]:
    kind, sep, amount = text.partition("=")
    if not sep or kind not in BUDGETS:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} is not KIND=N with KIND one of {', '.join(BUDGETS)}")
    try:
        value = float(amount)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_cut(amount)!r} is not a number") from None
    if not math.isfinite(value) or value <= 0 or (kind != "flops" and value != int(value)):
        raise argparse.ArgumentTypeError(
            f"{_cut(text)}: the amount must be a positive {'number' if kind == 'flops' else 'integer'}"
        )
    return kind, value if kind == "flops" else int(value)


def _seed(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{_cut(text)} is not between 0 and {MAX_SEED} (2**64 - 1)")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{_cut(text)} is not a finite number")
    return value


class _Console(Console):
    json_document = False
    """This console writes the one JSON document of a --json command."""

    def on_broken_pipe(self) -> None:  # rich would exit 1, the status of a bug: main() handles it
        raise BrokenPipeError


_STEP_PARAMS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
"""What the parameters after ``NAME:`` of ``--sampler`` start with (a ':' before anything else is part of the name)."""


def _sampler_step(text: str) -> tuple[str, dict[str, Any]]:
    """``top_k:k=40,x=0.5`` -> ("top_k", {"k": 40, "x": 0.5}): the name ends at the first ':' that
    parameters follow (so a qualified ``dist:name`` stays whole); each value is a TOML scalar."""
    cut = next((i for i, ch in enumerate(text) if ch == ":" and _STEP_PARAMS.match(text, i + 1)), None)
    name, rest = (text, "") if cut is None else (text[:cut], text[cut + 1 :])
    if not name:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} has no sampler name; write NAME or NAME:K=V,...")
    params: dict[str, Any] = {}
    for item in rest.split(",") if rest else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _STEP_PARAMS.fullmatch(key + "="):
            raise argparse.ArgumentTypeError(f"{_cut(text)!r}: {_cut(item)!r} is not K=V (e.g. top_k:k=40)")
        if key in params:
            raise argparse.ArgumentTypeError(f"{_cut(text)!r} sets {key} twice")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = None
        if not isinstance(parsed, (bool, int, float, str)):
            raise argparse.ArgumentTypeError(
                f"{_cut(text)!r}: {key}={_cut(value)} is not a TOML number, true/false or quoted string"
            )
        params[key] = parsed
    return name, params


def _flag_dest(name: str) -> str:
    return f"sampler flag {name}"


def _add_sampler_flags(parser: argparse.ArgumentParser, registry: Registry) -> None:
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
                dest=_flag_dest(entry.name),
                type=_int if flag.type is int else _finite_float,
                metavar=flag.param.upper(),
                help=escape_help(flag.help) + source,
            )
        except argparse.ArgumentError:
            raise PluginError(
                f"{culprit(entry)} declares the flag {option(entry.name)}, which gptzoo generate already has; "
                "rename the sampler (it stays usable as --sampler)"
            ) from None


def _unflagged_hint(registry: Registry, argv: Sequence[str]) -> str:
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


def _add_set(parser: argparse.ArgumentParser, what: str) -> None:
    """``--set K=V`` (repeatable) into ``overrides``; ``what`` says what it changes, with an example."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="K=V", help=f"{what} (repeatable)"
    )


def make_parser(registry: Registry | None = None) -> argparse.ArgumentParser:
    """The command line; with a registry, ``generate`` also has the flags of its samplers."""
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    common.add_argument("--json", action="store_true", help="print JSON for machines instead of tables")

    parser = Parser(prog="gptzoo", description="Build, inspect and run GPT-style models assembled from plugins.")
    parser.add_argument("--version", action="version", version=f"gptzoo {gptzoo_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    recipe = Parser(add_help=False)
    recipe.add_argument(
        "recipe", nargs="?", help="a shipped recipe name (see `gptzoo recipes`) or a .toml file; optional with --hf"
    )
    recipe.add_argument(
        "--hf",
        metavar="DIR|NAME",
        help="a Hugging Face checkpoint: a directory, a name `gptzoo fetch` knows, or a hub name in the local HF cache",
    )
    _add_set(recipe, "override a recipe key, e.g. model.n_layer=6")

    p = sub.add_parser(
        "build", parents=[common, recipe], help="build a model from a recipe and show what it is made of and costs"
    )
    p.add_argument(
        "--seq-len", type=_positive_int, metavar="T", help="sequence length for FLOPs (default: the context length)"
    )
    p.add_argument("--batch", type=_positive_int, default=1, metavar="B", help="batch size for FLOPs (default: 1)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write a checkpoint (model.safetensors + recipe.toml) to DIR: initialized, or with --hf's weights",
    )
    p.set_defaults(func=cmd_build)

    p = sub.add_parser(
        "compare", parents=[common, recipe], help="run Hugging Face and gptzoo on the same checkpoint and tokens"
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
        "--new-tokens", type=_positive_int, default=32, metavar="N", help="greedy tokens to compare (default: 32)"
    )
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "generate", parents=[common, recipe], help="generate text from a recipe, Hugging Face weights or a checkpoint"
    )
    p.add_argument("--checkpoint", metavar="DIR", help="a gptzoo checkpoint directory (instead of RECIPE / --hf)")
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        metavar="TEXT",
        help="a prompt (repeatable: prompts run as one batch)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        metavar="N",
        help="default: the recipe's [generate] max_new_tokens (128)",
    )
    p.add_argument(
        "--sampler",
        dest="samplers",
        action="append",
        default=[],
        type=_sampler_step,
        metavar="NAME[:K=V,...]",
        help="add a registered sampler step, or set the parameters of the chain's one, e.g. top_k:k=40 "
        "(repeatable; values are TOML: 0.9, 3, true, 'text'; see `gptzoo list sampler`)",
    )
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end a row's text at this string (repeatable)"
    )
    p.add_argument(
        "--seed",
        type=_seed,
        metavar="S",
        help=f"0..{MAX_SEED}: make sampling (and random weights, when a recipe has none) reproducible",
    )
    p.add_argument(
        "--dtype",
        choices=GENERATE_DTYPES,
        default="float32",
        help="int8: every Linear layer's weights in int8 (a float32 scale per row), the rest in float32",
    )
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    if registry is not None:
        _add_sampler_flags(p, registry)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "eval", parents=[common], help="loss, perplexity and bits per byte on held-out text, at several lengths"
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a gptzoo checkpoint or run directory, a Hugging Face directory or fetchable name, or a recipe with "
        "[weights]",
    )
    p.add_argument(
        "--text", action="append", default=[], metavar="FILE", help="a UTF-8 text file, one document (repeatable)"
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="DIR",
        help="prepared data (`gptzoo prepare`): its val.bin, in the model's tokenizer (repeatable)",
    )
    p.add_argument(
        "--lengths",
        type=_lengths,
        metavar="L,L,...",
        help="context lengths in tokens, also beyond the training context where the positions allow "
        "(default: the context length, at most 1024)",
    )
    p.add_argument(
        "--stride", type=_positive_int, metavar="S", help="tokens between sliding windows (default: half the length)"
    )
    p.add_argument("--batch", type=_positive_int, metavar="B", help="windows per forward (default: by memory)")
    p.add_argument("--max-tokens", type=_positive_int, metavar="N", help="only the first N tokens of each text")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32")
    _add_set(p, "override a recipe key where the weights keep their meaning, e.g. model.attention=eager")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", parents=[common], help="write a gptzoo checkpoint as a Hugging Face checkpoint")
    p.add_argument("checkpoint", help="a gptzoo checkpoint directory (from `gptzoo build --out`)")
    p.add_argument("--hf", required=True, metavar="OUT", help="the new Hugging Face checkpoint directory")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "fetch", parents=[common], help="download and convert real pretrained weights into the user cache"
    )
    p.add_argument("name", help=f"one of: {', '.join(FETCHABLE)}")
    p.add_argument("--force", action="store_true", help="convert again even if already fetched")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser(
        "prepare", parents=[common], help="tokenize a corpus into train.bin / val.bin / meta.json for training"
    )
    p.add_argument(
        "source",
        help="a text file, a directory of *.txt / *.md files (recursively), or a corpus: "
        + "; ".join(f"{k}: {v}" for k, v in sorted(CORPORA.items())),
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="a new (or empty) directory for train.bin, val.bin and meta.json"
    )
    p.add_argument(
        "--tokenizer",
        default="gpt2",
        metavar="NAME|DIR",
        help=f"{', '.join(NAMED_TOKENIZERS)} (default: gpt2), a Hugging Face tokenizer directory, "
        f"or a name `gptzoo fetch` knows ({', '.join(FETCHABLE)})",
    )
    p.add_argument(
        "--val-fraction",
        type=_finite_float,
        default=DEFAULT_VAL_FRACTION,
        metavar="F",
        help=f"the last F of the tokens become val.bin, 0 < F <= 0.5 (default: {DEFAULT_VAL_FRACTION})",
    )
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser(
        "train", parents=[common], help="train a recipe on prepared data (also under torchrun: DDP or FSDP2)"
    )
    p.add_argument("recipe", help="a shipped recipe name or a .toml file; its [train] section sets the run")
    _add_set(p, "override a recipe key, e.g. train.max_steps=200")
    p.add_argument("--data", metavar="DIR", help="prepared data (`gptzoo prepare`); default: the recipe's train.data")
    p.add_argument(
        "--out", metavar="DIR", help="the run directory: metrics.jsonl and checkpoints (default: runs/RECIPE)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument(
        "--init-from-hf",
        metavar="DIR|NAME",
        help="start from a Hugging Face checkpoint's weights (fine-tuning); it must fit the recipe",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "sweep",
        parents=[common],
        help="train and evaluate every variant of an ablation (a spec), with seeds, then report what each swap did",
    )
    p.add_argument("spec", metavar="SPEC", help="a sweep spec (.toml) or a shipped sweep: " + ", ".join(SWEEPS))
    p.add_argument("--out", metavar="DIR", help="the sweep directory (default: sweeps/SPEC)")
    p.add_argument("--resume", action="store_true", help="finish the sweep in --out: only the runs it lacks")
    p.add_argument(
        "--jobs", type=_positive_int, default=1, metavar="N", help="runs at once, each in its own process (default 1)"
    )
    p.add_argument("--data", metavar="DIR", help="prepared data for every run, instead of the spec's [data]")
    p.add_argument(
        "--budget",
        type=_budget,
        metavar="KIND=N",
        help="instead of the spec's [budget]: steps=N, tokens=N or flops=N per run (e.g. a short try: steps=20)",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "plot", parents=[common], help="draw a run's loss into a PNG, or a sweep's plots into its directory"
    )
    p.add_argument("run", help="a run directory (`gptzoo train --out`) or a sweep directory (`gptzoo sweep --out`)")
    p.add_argument("--out", metavar="PNG", help="default: RUN/loss.png (a run only)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("plugins", parents=[common], help="list plugins, where they come from and what they registered")
    p.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="NAME",
        help="run the conformance kit (gptzoo.testing) instead of listing: on the components of one plugin (its "
        "entry-point name or distribution, e.g. gptzoo for the built-ins) or one component (KIND:NAME); without "
        "NAME, on every component that a third-party plugin registered. Exit 1 when a check fails",
    )
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("list", parents=[common], help="list registered components")
    p.add_argument("kind", nargs="?", choices=KINDS, help="only this kind")
    p.add_argument("name", nargs="?", help="only the components of this name (bare, or qualified: DIST:name)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("recipes", parents=[common], help="list shipped recipes")
    p.add_argument(
        "--uses",
        action="append",
        default=[],
        metavar="NAME",
        help="only recipes with a component of this name, in any layer (bare or DIST:name; repeat to ask for several)",
    )
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser(
        "new-plugin", parents=[common], help="write a new plugin package: a component, its tests, pyproject.toml"
    )
    p.add_argument(
        "name", help="the component's name, e.g. sliding_window (its module: gptzoo_NAME, distribution: gptzoo-NAME)"
    )
    p.add_argument("--kind", required=True, choices=KINDS, help="the kind of component")
    p.add_argument("--out", metavar="DIR", help="a new directory for the package (default: gptzoo-NAME)")
    p.set_defaults(func=cmd_new_plugin)
    return parser


def _text(value: object) -> str:
    """Text from outside (a name, a path, a plugin's message) for a rich line: markup and control
    characters escaped."""
    return escape(terminal_text(str(value)))


def _print_json(out: Console, obj: Any) -> None:
    out.file.write(json.dumps(obj, indent=2) + "\n")


def _write_text(out: Console, text: str) -> None:
    """Model text exactly as it is (rich would expand tabs and parse markup)."""
    out.file.write(text)
    out.file.flush()


@contextmanager
def _importing() -> Iterator[None]:
    """Around a command's imports of the library, which load torch (a second or more): Ctrl-C there did
    nothing, and says so."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("nothing was done") from None


def _registry(err: Console) -> Registry:
    """The one registry a command validates, builds and loads with; failed plugins are warnings."""
    registry = get_registry()
    for info in registry.failed:
        message = f"plugin {info.name!r} ({info.distribution} {info.version}) failed: {info.error}"
        err.print(f"[yellow]warning:[/yellow] {_text(message)}; see `gptzoo plugins`")
    return registry


def cmd_build(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.loader import build
        from gptzoo.model.summary import render_summary

    summary = build(
        args.recipe,
        hf=args.hf,
        overrides=args.overrides,
        batch=args.batch,
        seq_len=args.seq_len,
        out=args.out,
        registry=_registry(err),
    )
    if args.json:
        _print_json(out, summary)
        return
    render_summary(summary, out)
    if args.out is not None:
        out.print(f"checkpoint written to {_text(summary['checkpoint'])}")


def cmd_compare(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.hf.compare import compare
        from gptzoo.loader import resolve_recipe
        from gptzoo.model.summary import DTYPES

    registry = _registry(err)
    recipe, source = resolve_recipe(
        args.recipe, hf=args.hf, overrides=args.overrides, registry=registry, need_weights=True
    )
    result = compare(
        source,
        recipe,
        prompts=args.prompt or [DEFAULT_PROMPT],
        dtype=DTYPES[args.dtype],
        new_tokens=args.new_tokens,
        chat=args.chat,
        registry=registry,
    )
    if args.json:
        _print_json(out, result)
        return
    title = f"{result['recipe']}: gptzoo vs Hugging Face, {result['dtype']}, {result['new_tokens']} greedy tokens"
    table = Table(title=_text(title), title_justify="left")
    for col in ("prompt", "tokens", "max |dlogit|", "mean |dlogit|", "top-1", "KL(HF||gptzoo)", "greedy"):
        table.add_column(col, overflow="fold")
    for row in result["prompts"]:
        prompt = row["prompt"] if isinstance(row["prompt"], str) else f"{len(row['prompt'])} token ids"
        table.add_row(
            _text(prompt),
            str(row["n_tokens"]),
            f"{row['max_abs_diff']:.2e}",
            f"{row['mean_abs_diff']:.2e}",
            f"{row['top1_agreement']:.1%}",
            f"{row['kl_hf_gptzoo']:.2e}",
            "[green]same[/green]" if row["greedy_match"] else "[red]differs[/red]",
        )
    out.print(table)
    for row in result["prompts"]:
        if "gptzoo_text" in row:
            out.print(f"[bold]gptzoo:[/bold] {_text(row['gptzoo_text'])}")
            if not row["greedy_match"]:
                out.print(f"[bold]HF:[/bold]     {_text(row['hf_text'])}")


def cmd_generate(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.inference.generate import plan_generation
        from gptzoo.inference.quantize import quantize_int8
        from gptzoo.inference.sampling import flagged
        from gptzoo.loader import load_model
        from gptzoo.model.summary import DTYPES

    registry = args.registry  # built once, before the command line was parsed (it has the sampler flags)
    int8 = args.dtype == "int8"
    loaded = load_model(
        args.recipe,
        hf=args.hf,
        checkpoint=args.checkpoint,
        overrides=args.overrides,
        registry=registry,
        dtype=DTYPES["float32" if int8 else args.dtype],
        seed=args.seed,
    )
    if int8:
        quantize_int8(loaded.model)
    sampling = {entry.name: getattr(args, _flag_dest(entry.name)) for entry, _ in flagged(registry)}
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
        err.print(f"[yellow]warning:[/yellow] {_text(warning)}")
    stream = None
    if not args.json and len(plan.prompts) == 1:
        err.print(f"[dim]sampler: {_text(plan.sampler.describe())}[/dim]")
        _write_text(out, args.prompt[0] + ("\n" if args.chat else ""))

        def stream(row: int, text: str) -> None:
            _write_text(out, text)

    try:
        results, tokens_per_s = plan.run(stream)
    except KeyboardInterrupt:
        if stream is not None:
            _write_text(out, "\n")  # end the streamed line before the message
        raise
    if args.json:
        _print_json(
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
                "recipe": loaded.recipe.name,
            },
        )
        return
    if stream is not None:
        _write_text(out, "\n")
        err.print(f"[dim]({results[0].finish_reason}, {len(results[0].tokens)} tokens)[/dim]")
    else:
        err.print(f"[dim]sampler: {_text(plan.sampler.describe())}[/dim]")
        for prompt, r in zip(args.prompt, results, strict=True):
            _write_text(out, f"{prompt}{r.text}\n")
            out.print(f"[dim]({r.finish_reason}, {len(r.tokens)} tokens)[/dim]")
    err.print(f"[dim]{tokens_per_s:.1f} tokens/s[/dim]")


def cmd_eval(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.evaluation import eval_model
        from gptzoo.evaluation.display import EvalProgress, render_eval
        from gptzoo.model.summary import DTYPES

    with nullcontext() if args.json else EvalProgress(err) as progress:
        report = eval_model(
            args.model,
            texts=args.text,
            data=args.data,
            lengths=args.lengths,
            stride=args.stride,
            batch_size=args.batch,
            max_tokens=args.max_tokens,
            dtype=DTYPES[args.dtype],
            overrides=args.overrides,
            registry=_registry(err),
            progress=progress,
        )
    if args.json:
        _print_json(out, report)
        return
    render_eval(report, out)


def cmd_export(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.hf import export_hf
        from gptzoo.model.checkpoint import load_checkpoint

    registry = _registry(err)
    model = load_checkpoint(args.checkpoint, registry=registry)
    path = export_hf(model, args.hf, tokenizer_from=args.checkpoint, registry=registry)
    if args.json:
        _print_json(out, {"hf": str(path)})
        return
    out.print(f"Hugging Face checkpoint written to {_text(str(path))}")


def cmd_fetch(args: argparse.Namespace, out: Console, err: Console) -> None:
    path = fetch(args.name, force=args.force, log=(lambda msg: err.print(_text(msg))) if not args.json else None)
    if args.json:
        _print_json(out, {"name": args.name, "path": str(path)})
        return
    out.print(f"{args.name}: {_text(str(path))}")


def cmd_prepare(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.training.data import prepare

    meta = prepare(
        args.source,
        args.out,
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        log=(lambda msg: err.print(_text(msg))) if not args.json else None,
    )
    if args.json:
        _print_json(out, meta)
        return
    source, tokenizer = meta["source"], meta["tokenizer"]
    total = meta["train_tokens"] + meta["val_tokens"]
    table = Table(
        title=f"{_text(args.source)} prepared in {_text(meta['out'])}", title_justify="left", show_header=False
    )
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in (
        ("read", _text(source["read"])),
        ("text", f"{source['documents']:,} documents, {source['bytes']:,} bytes, sha256 {source['sha256'][:16]}…"),
        (
            "tokenizer",
            _text(tokenizer["name"] + (f" ({tokenizer['directory']})" if "directory" in tokenizer else ""))
            + f", vocab {meta['vocab_size']:,}",
        ),
        ("tokens", f"{total:,} ({source['bytes'] / total:.2f} bytes per token), stored as {meta['dtype']}"),
        ("train.bin", f"{meta['train_tokens']:,} tokens"),
        ("val.bin", f"{meta['val_tokens']:,} tokens (the last {meta['val_fraction']:g} of the stream)"),
        ("time", f"{meta['seconds']:.1f} s ({total / max(meta['seconds'], 1e-9):,.0f} tokens/s)"),
    ):
        table.add_row(key, value)
    out.print(table)


def cmd_train(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.loader import load_model
        from gptzoo.training.display import TrainDisplay
        from gptzoo.training.trainer import train

    try:
        registry = _registry(err)
        recipe = load_recipe(args.recipe, args.overrides, registry=registry)
        if args.resume and args.init_from_hf:
            raise GptzooError(
                "--resume continues a run from its checkpoint; --init-from-hf starts a new one: give one of them"
            )
        loaded = load_model(recipe, hf=args.init_from_hf, registry=registry) if args.init_from_hf else None
    except KeyboardInterrupt:
        raise Interrupted("before the first step; nothing was written") from None
    run = args.out if args.out is not None else Path("runs") / recipe.name  # an empty --out is refused by train
    main_process = _first_process(args)  # under torchrun, only rank 0 reports
    init, hf_dir = (loaded.model, loaded.hf_dir) if loaded is not None else (None, None)
    if args.json or not main_process:
        result = train(recipe, out=run, data=args.data, resume=args.resume, init=init, hf_dir=hf_dir, registry=registry)
    else:
        with TrainDisplay(err, total_steps=recipe.train.max_steps, title=recipe.name) as display:
            result = train(
                recipe,
                out=run,
                data=args.data,
                resume=args.resume,
                init=init,
                hf_dir=hf_dir,
                log=display,
                started=display.start,
                registry=registry,
            )
    if not main_process:
        return
    summary = result.summary(run)
    if args.json:
        _print_json(out, summary)
        return
    val = f", val loss {result.val_loss:.4f}" if result.val_loss is not None else ""
    out.print(f"{result.steps} steps, loss {result.loss:.4f}{val}; checkpoint {_text(summary['checkpoint'] or '-')}")
    out.print(
        f"[dim]generate with: gptzoo generate --checkpoint {_text(summary['checkpoint'] or '')} --prompt TEXT[/dim]"
    )


def cmd_sweep(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.sweep.display import RunBar
        from gptzoo.sweep.report import render_report
        from gptzoo.sweep.runner import run_sweep
        from gptzoo.sweep.spec import read_spec

    registry = _registry(err)
    spec = read_spec(args.spec, registry=registry, data=args.data, budget=args.budget)
    target = args.out if args.out is not None else Path("sweeps") / spec.name

    def bar(task: Any, k: int, total: int) -> RunBar:
        return RunBar(err, f"[{k}/{total}] {task.variant} seed {task.seed}", task.recipe.train.max_steps)

    report = run_sweep(
        spec,
        target,
        resume=args.resume,
        jobs=args.jobs,
        registry=registry,
        say=None if args.json or not _first_process(args) else (lambda line: err.print(_text(line))),
        display=None if args.json or not _first_process(args) else bar,
    )
    if report is None:  # under torchrun, not the first process: it reports
        return
    if args.json:
        _print_json(out, report)
        return
    render_report(report, out)
    out.print(f"report: {_text(str(Path(target) / 'report.md'))}")


def cmd_plot(args: argparse.Namespace, out: Console, err: Console) -> None:
    with _importing():
        from gptzoo.training.plot import plot_run

    if (Path(args.run) / SWEEP_RECORD).is_file():
        with _importing():
            from gptzoo.sweep.report import replot

        if args.out is not None:
            raise GptzooError("--out is for a run's plot; a sweep's plots go into its own directory")
        written = replot(Path(args.run))
        if args.json:
            _print_json(out, {"png": [str(p) for p in written]})
            return
        for path in written:
            out.print(f"wrote {_text(str(path))}")
        return
    png = plot_run(args.run, args.out)
    if args.json:
        _print_json(out, {"png": str(png)})
        return
    out.print(f"wrote {_text(str(png))}")


def _emit(
    args: argparse.Namespace,
    out: Console,
    rows: list[dict[str, Any]],
    title: str,
    columns: dict[str, Callable[[dict[str, Any]], str]],
) -> None:
    """Rows as JSON with --json, else as a table with these columns (header -> cell text)."""
    if args.json:
        _print_json(out, rows)
        return
    table = Table(title=title, title_justify="left")
    for header in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(cell(row) for cell in columns.values()))
    out.print(table)


def _origin(row: dict[str, Any]) -> str:
    return _text(f"{row['plugin']} ({row['distribution']} {row['version']})")


def cmd_plugins(args: argparse.Namespace, out: Console, err: Console) -> int | None:
    if args.check is not None:
        return check_plugins(args, out, err)
    registry = get_registry()
    registered: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    for entry in registry.all_entries():
        registered.setdefault(entry.provenance.plugin, []).append(f"{entry.kind}:{entry.name}")
        if (note := registry.note(entry)) is not None:
            notes.setdefault(entry.provenance.plugin, []).append(f"{entry.kind} {entry.name!r} is {note}")
    rows = [
        {**asdict(info), "registered": registered.get(info.module, []), "notes": notes.get(info.module, [])}
        for info in registry.plugins
    ]
    _emit(
        args,
        out,
        rows,
        "Plugins",
        {
            "plugin": lambda r: (
                _text(r["name"]) + (f"\n[dim]{_text(r['module'])}[/dim]" if r["module"] != r["name"] else "")
            ),
            "distribution": lambda r: _text(f"{r['distribution']} {r['version']}"),
            "status": _plugin_status,
            "registered": lambda r: "\n".join(
                [", ".join(r["registered"]), *(f"[yellow]{_text(n)}[/yellow]" for n in r["notes"])]
            ),
        },
    )


def check_plugins(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``gptzoo plugins --check [NAME]``: the conformance kit's results as a table (or JSON); exit 1
    when a check failed."""
    with _importing():
        from gptzoo.testing import run_conformance

    registry = _registry(err)
    entries = list(registry.all_entries())
    name = args.check
    if not name:
        chosen = [e for e in entries if e.provenance.distribution != GPTZOO_DISTRIBUTION]
    else:
        plugins = {info.name: info.module for info in registry.plugins}
        chosen = [
            e
            for e in entries
            if name in (f"{e.kind}:{e.name}", f"{e.kind}:{e.qualified_name}")
            or canonical_name(name) == canonical_name(e.provenance.distribution)
            or (name in plugins and e.provenance.plugin == plugins[name])
        ]
        if not chosen:
            known = sorted({*plugins, *(e.provenance.distribution for e in entries)})
            raise GptzooError(
                f"--check {name!r} names no plugin, distribution or component; plugins and distributions: "
                f"{', '.join(known)}; components: KIND:NAME as `gptzoo list` shows them"
            )
    results = run_conformance(registry, chosen)
    failed = sum(r.status == "failed" for r in results)
    if args.json:
        _print_json(out, {"components": len(chosen), "failed": failed, "results": [asdict(r) for r in results]})
    elif not chosen:
        out.print("no third-party plugin registered a component; `--check gptzoo` checks the built-ins")
    else:
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}
        table = Table(title="Conformance", title_justify="left")
        for header in ("component", "provenance", "check", "status", "detail"):
            table.add_column(header, overflow="fold")
        for r in results:
            table.add_row(
                _text(f"{r.kind}:{r.name}"),
                _text(f"{r.distribution} {r.version}"),
                _text(r.check),
                f"[{colour[r.status]}]{r.status}[/{colour[r.status]}]",
                _text(r.detail),
            )
        out.print(table)
        counts = {status: sum(r.status == status for r in results) for status in colour}
        out.print(", ".join(f"{n} {status}" for status, n in counts.items()))
    return 1 if failed else 0


def _plugin_status(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"[red]failed[/red]: {_text(row['error'] or '')}"
    return "[green]ok[/green]" + (f"\n[yellow]warning[/yellow]: {_text(row['warning'])}" if row["warning"] else "")


def cmd_list(args: argparse.Namespace, out: Console, err: Console) -> None:
    registry = _registry(err)
    entries = list(registry.all_entries(args.kind))
    if args.name is not None:
        entries = _named(registry, args.kind, args.name, entries)
    recipes = catalog.shipped(registry)
    rows = [
        {
            "kind": e.kind,
            "name": e.name,
            "qualified_name": e.qualified_name,
            "doc": e.doc,
            **asdict(e.provenance),
            "overrides": str(e.overrides) if e.overrides else None,
            "note": registry.note(e),
            "recipes": catalog.used_by(e, registry, recipes),
        }
        for e in entries
    ]
    _emit(
        args,
        out,
        rows,
        "Components",
        {
            "kind": lambda r: r["kind"],
            "name": lambda r: _text(r["name"]) + (f"\n[dim]{_text(r['qualified_name'])}[/dim]" if r["note"] else ""),
            "description": lambda r: _text(r["doc"]),
            "shipped recipes": lambda r: _text(_few(r["recipes"])),
            "from": lambda r: (
                _origin(r)
                + (_text(f", overrides {r['overrides']}") if r["overrides"] else "")
                + (f"\n[yellow]{_text(r['note'])}[/yellow]" if r["note"] else "")
            ),
        },
    )


def _few(names: list[str], n: int = 3) -> str:
    """``a, b, c +2``: the first n names and how many more."""
    return ", ".join(names[:n]) + (f" +{len(names) - n}" if len(names) > n else "")


def _named(registry: Registry, kind: str | None, name: str, entries: list[Any]) -> list[Any]:
    """The entries ``gptzoo list [KIND] NAME`` shows: the one a qualified name means, or every entry of
    a bare name (all of an ambiguous one); an unknown name is an error, as in a recipe."""
    dist, bare = split_name(name)
    matching = [
        e
        for e in entries
        if e.name == bare and (dist is None or canonical_name(e.provenance.distribution) == canonical_name(dist))
    ]
    if not matching and kind is not None:
        registry.get(kind, name)  # raises the unknown-name error, with what is available
    if not matching:
        raise GptzooError(f"no component is named {name!r}; see `gptzoo list`")
    return matching


def cmd_recipes(args: argparse.Namespace, out: Console, err: Console) -> None:
    rows = []
    names = None
    if args.uses:
        registry = _registry(err)
        names = {r.name for r in catalog.recipes_using(registry, args.uses, catalog.shipped(registry))}
    for name, path in shipped_recipes().items():
        if names is not None and name not in names:
            continue
        data = read_recipe_data(path)
        model = data.get("model", {})
        rows.append(
            {
                "name": name,
                "description": data.get("description", ""),
                "n_layer": model.get("n_layer"),
                "n_embd": model.get("n_embd"),
                "path": str(path),
            }
        )
    _emit(
        args,
        out,
        rows,
        "Recipes",
        {
            "name": lambda r: r["name"],
            "n_layer": lambda r: str(r["n_layer"]),
            "n_embd": lambda r: str(r["n_embd"]),
            "description": lambda r: _text(r["description"]),
        },
    )


def cmd_new_plugin(args: argparse.Namespace, out: Console, err: Console) -> None:
    scaffold = new_plugin(args.name, args.kind, args.out, registry=_registry(err))
    if args.json:
        _print_json(out, {**asdict(scaffold), "directory": str(scaffold.directory), "next": scaffold.next_steps})
        return
    out.print(f"wrote {_text(scaffold.directory)}: {_text(', '.join(scaffold.files))}")
    out.print(f"next: {_text(scaffold.next_steps)}")


def _first_process(args: argparse.Namespace) -> bool:
    """False in the other processes of a torchrun training or sweep (only the first one reports)."""
    if args is None or args.command not in TORCHRUN_COMMANDS:
        return True
    return _env_int("RANK", 0) == 0


def _env_int(name: str, default: int) -> int:
    """An integer that torchrun sets in the environment, or ``default`` when it is unset or not one."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _fail(args: argparse.Namespace | None, out: Console, err: Console, line: str, message: str, code: int) -> int:
    """Report an error on one stderr line (and as a JSON object on stdout with --json); its exit status."""
    err.print(line, highlight=False)
    if out.json_document and _first_process(args):
        _print_json(out, {"error": message, "exit": code})
    return code


def _debug(args: argparse.Namespace) -> None:
    """With --debug, the traceback of the exception being handled, its control characters escaped."""
    if args.debug:
        sys.stderr.write(terminal_text(traceback.format_exc(), lines=True))


def _run(args: argparse.Namespace, out: Console, err: Console) -> int | None:
    """The command and its exit status (None: 0); with --json, whatever else writes to sys.stdout
    meanwhile goes to stderr."""
    if not args.json:
        return args.func(args, out, err)
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        return args.func(args, out, err)
    finally:
        sys.stdout = stdout


def _document_stream() -> TextIO:
    """Where --json writes its one document: the real stdout, whose file descriptor 1 now leads to
    stderr for everything else in this process (a plugin's os.write, a subprocess, an atexit
    print). When stdout is no file descriptor (a test's capture), sys.stdout itself."""
    if sys.stdout is not sys.__stdout__:  # a caller's own stream (a test's capture): leave its descriptors be
        return sys.stdout
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()
        kept = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (AttributeError, OSError, ValueError):
        return sys.stdout
    return os.fdopen(kept, "w", encoding="utf-8")


def _sane_terminal() -> None:
    """What rich reads from the environment and the streams, made safe: a COLUMNS or LINES that is not a
    positive integer is ignored (COLUMNS=0 would print nothing), and a character the terminal's encoding
    cannot show is written as an escape rather than failing the command."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and not (value.isdigit() and int(value) > 0):
            del os.environ[name]
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _sane_terminal()
    err = _Console(stderr=True, emoji=False, highlight=False, soft_wrap=True)  # one message, one line
    if sys.stdout is None:  # started with stdout closed (>&-)
        err.print("[red]error:[/red] standard output is closed; give the command somewhere to write", highlight=False)
        return EXIT_USER_ERROR
    json_document = "--json" in argv  # flags are spelled out: this is exactly what argparse will see
    # Model text must reach the terminal as it is: no emoji codes, no highlighting, no hard wraps.
    out = _Console(
        file=_document_stream() if json_document else sys.stdout, emoji=False, highlight=False, soft_wrap=True
    )
    out.json_document = json_document
    try:
        code = _main(argv, out, err)
        out.file.flush()
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other commands do
        try:  # and the interpreter's last flush finds nowhere to fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.file.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # writing the output itself failed (stdout on a full disk)
        try:
            err.print(f"[red]error:[/red] cannot write the output: {_text(exc.strerror or str(exc))}", highlight=False)
        except OSError:
            pass
        return EXIT_USER_ERROR
    return code


def _main(argv: list[str], out: Console, err: Console) -> int:
    """Parse and run the command; its exit status, every error reported (output errors propagate)."""
    registry = None
    try:
        registry = _registry(err) if argv[:1] == ["generate"] else None  # its flags come from the samplers
        args = make_parser(registry).parse_args(argv)
        args.registry = registry
    except GptzooError as exc:  # a plugin failing in strict mode, a sampler's malformed flag
        message = exception_text(exc)
        return _fail(None, out, err, f"[red]error:[/red] {_text(message)}", message, EXIT_USER_ERROR)
    except UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        message = str(exc)
        if exc.parser.prog == "gptzoo" and argv and argv[0] in ("--json", "--debug"):
            message += f"; {argv[0]} goes after the command (gptzoo COMMAND {argv[0]} ...)"
        if registry is not None and "unrecognized arguments" in message:
            message += _unflagged_hint(registry, argv)
        line = _text(f"{exc.parser.prog}: error: {message.removeprefix(exc.parser.prog + ': ')}")
        return _fail(None, out, err, line, message, EXIT_USER_ERROR)
    except KeyboardInterrupt:
        message = "interrupted: nothing was done"
        return _fail(None, out, err, f"[yellow]{message}[/yellow]", message, EXIT_INTERRUPTED)
    code = 0
    try:
        try:
            code = _run(args, out, err) or 0
        except OSError as exc:
            if exc.filename is None or isinstance(exc, BrokenPipeError):
                raise
            # a path the command was given or wrote to, refused by the system: a full disk, a permission...
            raise GptzooError(f"cannot use {exc.filename}: {exc.strerror}; check the path and its permissions") from exc
    except GptzooError as exc:
        _debug(args)
        message = exception_text(exc)
        line = f"[red]error:[/red] {escape(terminal_text(message, lines=exc.multiline))}"
        code = _fail(args, out, err, line, message, EXIT_USER_ERROR)
    except KeyboardInterrupt as exc:  # gptzoo.errors.Interrupted says what was kept
        _debug(args)
        text = exception_text(exc)
        message = f"interrupted: {text}" if text else "interrupted"
        code = _fail(args, out, err, f"[yellow]{_text(message)}[/yellow]", message, EXIT_INTERRUPTED)
    if args.command in TORCHRUN_COMMANDS and _env_int("WORLD_SIZE", 1) > 1:
        # torch 2.13 with gloo aborted at interpreter exit after DDP in 1 to 3 runs of 6, although the work
        # was done ("terminate called without an active exception"): leave right away, with the run's own status.
        out.file.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

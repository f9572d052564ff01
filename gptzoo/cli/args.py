"""Argument types and the parsers the commands share: flags are spelled out, and a value refused names itself."""

from __future__ import annotations

import argparse
import math
import re
import tomllib
from typing import Any, NoReturn

from gptzoo.cli.render import cut
from gptzoo.defaults import MAX_DIM, SEED_LIMIT
from gptzoo.sweep.names import BUDGETS

MAX_SEED = SEED_LIMIT - 1
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


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{cut(text)!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = integer(text)
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{cut(text)} must be between 1 and {MAX_COUNT}")
    return value


def count_or_all(text: str) -> int | None:
    """A positive integer, or ``all`` (None: no limit)."""
    return None if text.strip().lower() == "all" else positive_int(text)


def lengths(text: str) -> list[int]:
    """Comma-separated positive integers: --lengths 128,256,512."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{cut(text)!r} names no length; give e.g. 128,256,512")
    return sorted(set(values))


def budget(text: str) -> tuple[str, float]:
    kind, sep, amount = text.partition("=")
    if not sep or kind not in BUDGETS:
        raise argparse.ArgumentTypeError(f"{cut(text)!r} is not KIND=N with KIND one of {', '.join(BUDGETS)}")
    try:
        value = float(amount)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{cut(amount)!r} is not a number") from None
    if not math.isfinite(value) or value <= 0 or (kind != "flops" and value != int(value)):
        raise argparse.ArgumentTypeError(
            f"{cut(text)}: the amount must be a positive {'number' if kind == 'flops' else 'integer'}"
        )
    return kind, value if kind == "flops" else int(value)


def seed(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{cut(text)} is not between 0 and {MAX_SEED} (2**64 - 1)")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{cut(text)!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{cut(text)} is not a finite number")
    return value


_STEP_PARAMS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
"""What the parameters after ``NAME:`` of ``--sampler`` start with (a ':' before anything else is part of the name)."""


def sampler_step(text: str) -> tuple[str, dict[str, Any]]:
    """``top_k:k=40,x=0.5`` -> ("top_k", {"k": 40, "x": 0.5}): the name ends at the first ':' that
    parameters follow (so a qualified ``dist:name`` stays whole); each value is a TOML scalar."""
    end = next((i for i, ch in enumerate(text) if ch == ":" and _STEP_PARAMS.match(text, i + 1)), None)
    name, rest = (text, "") if end is None else (text[:end], text[end + 1 :])
    if not name:
        raise argparse.ArgumentTypeError(f"{cut(text)!r} has no sampler name; write NAME or NAME:K=V,...")
    params: dict[str, Any] = {}
    for item in rest.split(",") if rest else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _STEP_PARAMS.fullmatch(key + "="):
            raise argparse.ArgumentTypeError(f"{cut(text)!r}: {cut(item)!r} is not K=V (e.g. top_k:k=40)")
        if key in params:
            raise argparse.ArgumentTypeError(f"{cut(text)!r} sets {key} twice")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = None
        if not isinstance(parsed, (bool, int, float, str)):
            raise argparse.ArgumentTypeError(
                f"{cut(text)!r}: {key}={cut(value)} is not a TOML number, true/false or quoted string"
            )
        params[key] = parsed
    return name, params


Subparsers = Any
"""What ``ArgumentParser.add_subparsers`` returns (argparse's ``_SubParsersAction``, a private name)."""


def recipe_parser() -> Parser:
    """The parent parser of the commands that take a recipe: RECIPE, ``--hf`` and ``--set``."""
    recipe = Parser(add_help=False)
    recipe.add_argument(
        "recipe", nargs="?", help="a shipped recipe name (see `gptzoo recipes`) or a .toml file; optional with --hf"
    )
    recipe.add_argument(
        "--hf",
        metavar="DIR|NAME",
        help="a Hugging Face checkpoint: a directory, a name `gptzoo fetch` knows, or a hub name in the local HF cache",
    )
    add_set(recipe, "override a recipe key, e.g. model.n_layer=6")
    add_offline(recipe)
    return recipe


def add_set(parser: argparse.ArgumentParser, what: str) -> None:
    """``--set K=V`` (repeatable) into ``overrides``; ``what`` says what it changes, with an example."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="K=V", help=f"{what} (repeatable)"
    )


def add_offline(parser: Parser) -> None:
    """``--offline``: download nothing (gptzoo.fetch.OFFLINE_VARIABLES)."""
    parser.add_argument(
        "--offline",
        action="store_true",
        help="download nothing: a model that is not on disk is an error (as with GPTZOO_OFFLINE=1 or HF_HUB_OFFLINE=1)",
    )

"""``gptzoo serve``: a model behind an OpenAI-compatible HTTP API (gptzoo.serve), on loopback unless told."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gptzoo.cli.args import Parser, Subparsers, integer, positive_int, seed
from gptzoo.cli.console import Console, warn
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.model import load_named, model_parser
from gptzoo.cli.render import text
from gptzoo.defaults import PRECISIONS
from gptzoo.errors import GptzooError
from gptzoo.registry import Registry

if TYPE_CHECKING:
    from gptzoo.loader import Loaded

SERVER_EXTRA = "pip install 'gptzoo[serve]'"


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "serve",
        parents=[common, model_parser("override a recipe key, e.g. generate.max_new_tokens=64", several_adapters=True)],
        help="serve a model over OpenAI's API (/v1/completions, /v1/chat/completions) with continuous batching",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    p.add_argument("--port", type=integer, default=8000, metavar="N", help="default 8000; 0: any free port")
    p.add_argument("--name", metavar="NAME", help="the model name requests give (default: MODEL as given)")
    p.add_argument(
        "--max-batch", type=positive_int, default=16, metavar="N", help="sequences decoded together (default 16)"
    )
    p.add_argument("--dtype", choices=tuple(PRECISIONS), default="float32", help="the weights' precision")
    p.add_argument("--seed", type=seed, metavar="S", help="random weights of a recipe that has none, reproducibly")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    if not 0 <= args.port <= 65535:
        raise GptzooError(f"--port {args.port} is not a port; give 0 (any free one) to 65535")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        missing = (exc.name or "starlette").split(".")[0]
        raise GptzooError(f"gptzoo serve needs starlette and uvicorn ({missing} is missing): {SERVER_EXTRA}") from None
    with importing():
        from gptzoo.serve.server import Server

    registry = command_registry(err)
    name = args.name or args.model or args.hf or args.checkpoint
    loaded, models = served_models(args, name, registry, err)
    for warning in loaded.warnings:
        warn(err, warning)
    server = Server(models, loaded.tokenizer(), registry, host=args.host, port=args.port, max_batch=args.max_batch)
    err.print(text(f"serving {', '.join(models)} at {server.url} — {server.engine.describe()}"))
    server.run()


def served_models(args: argparse.Namespace, name: str, registry: Registry, err: Console) -> tuple[Loaded, dict]:
    """MODEL as ``name`` and the models its ``--adapter``s make (gptzoo.loader.with_adapters), in ``--dtype``."""
    from gptzoo.loader import adapter_names, with_adapters

    adapters = args.adapter or []
    adapter_names(name, adapters)  # before the model is loaded
    args.adapter = None  # loaded in float32: each adapter goes into the float32 weights first
    base = load_named(args, registry, dtype="float32" if adapters else args.dtype, seed=args.seed, random=True, err=err)
    if not adapters:
        return base, {name: base.model}
    return with_adapters(base, name, adapters, args.dtype, registry)

"""``gptzoo serve``: a model behind an OpenAI-compatible HTTP API (gptzoo.serve), on loopback unless told."""

from __future__ import annotations

import argparse
import contextlib
import copy
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
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
        import uvicorn
    except ImportError as exc:
        missing = (exc.name or "starlette").split(".")[0]
        raise GptzooError(f"gptzoo serve needs starlette and uvicorn ({missing} is missing): {SERVER_EXTRA}") from None
    with importing():
        from gptzoo.serve.app import Served, make_app
        from gptzoo.serve.engine import Engine

    registry = command_registry(err)
    name = args.name or args.model or args.hf or args.checkpoint
    loaded, models = served_models(args, name, registry, err)
    for warning in loaded.warnings:
        warn(err, warning)
    tokenizer = loaded.tokenizer()
    model = loaded.model
    context = model.context_length or model.max_positions
    if context is None:
        raise GptzooError(f"{loaded.recipe.name} sets no context_length; give one with --set model.context_length=N")
    eos, vocab = tokenizer.eos_token_id, tokenizer.vocab_size
    engine = Engine(models, eos_token_id=eos, vocab_size=vocab, max_batch=args.max_batch, context=context)
    served = Served(model, tokenizer, registry, engine, tuple(models), context)
    try:
        listener = socket.create_server((args.host, args.port))
    except OSError as exc:
        raise GptzooError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}; give another --port") from None
    port = listener.getsockname()[1]
    shown = ", ".join(models)
    err.print(text(f"serving {shown} at http://{args.host}:{port}/v1 — {engine.describe()}"))
    config = uvicorn.Config(make_app(served), log_level="warning", timeout_graceful_shutdown=None)
    server_class()(config).run(sockets=[listener])


def served_models(args: argparse.Namespace, name: str, registry: Registry, err: Console) -> tuple[Loaded, dict]:
    """MODEL as ``name`` (with ``--adapter DIR`` in it, if one has no name), and a copy of it with each
    ``--adapter NAME=DIR`` as the model NAME, every one in ``--dtype``.

    Raises:
        GptzooError: two unnamed adapters, an empty or repeated name, or what loading one says.
    """
    from gptzoo.adapters.peft_format import split_adapter
    from gptzoo.loader import with_adapter, with_precision

    adapters = args.adapter or []
    given = [(split_adapter(a)[0], a) for a in adapters]
    unnamed = [a for n, a in given if n is None]
    named = [(n, a) for n, a in given if n is not None]
    if len(unnamed) > 1:
        raise GptzooError(
            f"--adapter {unnamed[1]} has no name, and only one adapter can take MODEL's place; name the others "
            "with --adapter NAME=DIR"
        )
    names = [name, *(n for n, _ in named)]
    bad = next((n for i, n in enumerate(names) if not n.strip() or n in names[:i]), None)
    if bad is not None:
        raise GptzooError(
            f"--adapter {bad!r}=... names no model or one already served ({', '.join(map(repr, names))}); give each "
            "adapter a name of its own"
        )
    args.adapter = None  # loaded in float32: each adapter goes into the float32 weights first
    base = load_named(args, registry, dtype="float32" if adapters else args.dtype, seed=args.seed, random=True, err=err)
    if not adapters:
        return base, {name: base.model}
    copies = {n: with_adapter(replace(base, model=copy.deepcopy(base.model)), a, registry) for n, a in named}
    if unnamed:
        base = with_adapter(base, unnamed[0], registry)
    models = {name: with_precision(base, args.dtype, registry)}
    models.update({n: with_precision(c, args.dtype, registry) for n, c in copies.items()})
    said = tuple(dict.fromkeys(f"{n}: {w}" if n != name else w for n, m in models.items() for w in m.warnings))
    return replace(models[name], warnings=said), {n: m.model for n, m in models.items()}


def server_class() -> type:
    """uvicorn's Server, except that a SIGTERM or Ctrl-C that drained the requests ends the process with
    status 0 (uvicorn raises the signal again once it has shut down, so the process dies of it)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server

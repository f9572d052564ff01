"""A running ``gptzoo serve``: the engine over the models, the HTTP application over the engine, a listening
socket, and uvicorn's server with the shutdown a deployment expects (:meth:`Server.run`)."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping

import uvicorn

from gptzoo.errors import GptzooError
from gptzoo.inference.engine import Engine
from gptzoo.model.gpt import GPT
from gptzoo.registry import Registry
from gptzoo.serve.app import Served, make_app
from gptzoo.tokenizer import Tokenizer

ABORTED = "the server was stopped before the sequence ended (a second SIGTERM or Ctrl-C)"
"""The error of a sequence a second SIGTERM or Ctrl-C ended."""


class Server:
    """``models`` (by the names requests give; the first is the base) served on ``host:port`` (0: a free
    port), each with a batch of at most ``max_batch`` sequences.

    Raises:
        GptzooError: the base model sets no context length, or the address cannot be listened on.
    """

    def __init__(
        self,
        models: Mapping[str, GPT],
        tokenizer: Tokenizer,
        registry: Registry,
        *,
        host: str,
        port: int,
        max_batch: int,
    ) -> None:
        model = next(iter(models.values()))
        context = model.context_length or model.max_positions
        if context is None:
            name = model.recipe.name if model.recipe is not None else "the model"
            raise GptzooError(f"{name} sets no context_length; give one with --set model.context_length=N")
        for served in models.values():
            served.eval()
        eos, vocab = tokenizer.eos_token_id, tokenizer.vocab_size
        self.engine = Engine(models, eos_token_id=eos, vocab_size=vocab, max_batch=max_batch, context=context)
        self.served = Served(model, tokenizer, registry, self.engine, tuple(models), context)
        try:
            self.listener = socket.create_server((host, port))
        except OSError as exc:
            raise GptzooError(f"cannot listen on {host}:{port}: {exc.strerror}; give another --port") from None
        self.url = f"http://{host}:{self.listener.getsockname()[1]}/v1"

    def run(self) -> None:
        """Serve until SIGTERM or Ctrl-C, then drain (:func:`server_class`) and return."""
        config = uvicorn.Config(make_app(self.served), log_level="warning", timeout_graceful_shutdown=None)
        stopping, engine = self.served.stopping, self.engine
        server_class(stopping, lambda: engine.abort(ABORTED))(config).run(sockets=[self.listener])


def server_class(stopping: threading.Event, abort: Callable[[], None]) -> type:
    """uvicorn's Server, except that the first SIGTERM or Ctrl-C sets ``stopping`` (requests whose bodies
    are still arriving are then refused, those in flight drain), a second one of either calls ``abort``
    (the sequences in flight end at their next step, their requests answered with the error), and a
    shutdown ends the process with status 0 (uvicorn raises the signal again once it has shut down, so the
    process dies of it)."""

    class Shutdown(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if stopping.is_set():
                abort()
            stopping.set()
            self.should_exit = True

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

    return Shutdown

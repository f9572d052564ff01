"""The OpenAI-compatible HTTP API over an :class:`gptzoo.inference.engine.Engine`: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, whole or streamed as server-sent events.

Every error is OpenAI's JSON error object with its status (gptzoo.serve.requests.ApiError); a request
whose client goes away has its sequences cancelled, which frees their rows of the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gptzoo.errors import GptzooError
from gptzoo.inference.engine import Engine, Event, Finished, Job, PromptScores, Token
from gptzoo.inference.generate import RowText, make_generator
from gptzoo.inference.sampling import SamplerChain, chain_spec
from gptzoo.model.gpt import GPT
from gptzoo.registry import Registry
from gptzoo.serve import requests
from gptzoo.serve.requests import ApiError
from gptzoo.tokenizer import Tokenizer

MAX_BODY_BYTES = 8 * 2**20
"""The largest request body read (a larger one is a 413)."""
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
"""The engine's (and a stop string's) end of a sequence -> OpenAI's finish_reason."""


@dataclass
class Served:
    """What the routes share: the model, its tokenizer and registry, the engine, the names it answers to."""

    model: GPT
    tokenizer: Tokenizer
    registry: Registry
    engine: Engine
    names: tuple[str, ...]
    context: int
    created: int = field(default_factory=lambda: int(time.time()))
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when the server begins to shut down (its first SIGTERM or Ctrl-C)."""


@dataclass
class Choice:
    """One sequence of a response: its job, its text so far and what it was given."""

    index: int
    prompt: list[int]
    job: Job
    text: RowText
    tokens: list[Token] = field(default_factory=list)
    prompt_scores: tuple[Token, ...] = ()
    reason: str | None = None
    message: str | None = None
    """The error, when the engine failed this sequence."""

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish_reason of the sequence."""
        return FINISH_REASONS.get(self.reason or "length", "length")


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


STOPPING_POLL = 0.25
"""Seconds between two looks at whether the server is stopping, while a request's body is still arriving."""


async def _body(request: Request, stopping: threading.Event) -> Any:
    """The request's JSON body, read up to :data:`MAX_BODY_BYTES` (a 503 once the server is stopping while
    the body is still arriving: a client that never finishes sending cannot hold the shutdown), and
    parsed away from the event loop."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {length} bytes; this server reads at most {MAX_BODY_BYTES}")
    chunks, size = [], 0
    stream = request.stream()
    while True:
        chunk = asyncio.ensure_future(anext(stream, None))
        while not chunk.done():
            await asyncio.wait({chunk}, timeout=STOPPING_POLL)
            if not chunk.done() and stopping.is_set():
                chunk.cancel()
                raise ApiError(503, "the server is shutting down; send the request again to another server")
        if chunk.result() is None:
            break
        size += len(chunk.result())
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes, the most this server reads")
        chunks.append(chunk.result())
    try:
        return await asyncio.to_thread(json.loads, b"".join(chunks))
    except (ValueError, RecursionError):
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
            "HTTP library correctly. The OpenAI API expects a JSON payload.)",
        ) from None


def _jobs(served: Served, parsed: requests.Request, deliver: Callable[[int, Event], None]) -> list[Choice]:
    """A job for each prompt and each of its ``n`` choices, with its own sampler chain and generator."""
    recipe = served.model.recipe
    steps = [(c.name, c.kwargs) for c in recipe.generate.samplers] if recipe is not None else []
    spec = chain_spec(steps, parsed.sampling, registry=served.registry)
    SamplerChain.from_registry(served.registry, spec).rehearse(served.model.wte.num_embeddings, parsed.prompts[0])
    device = served.model.wte.weight.device
    choices = []
    for p, prompt in enumerate(parsed.prompts):
        for k in range(parsed.n):
            index = p * parsed.n + k
            seed = None if parsed.seed is None else (parsed.seed + index) % 2**64
            job = Job(
                prompt,
                parsed.max_tokens[p],
                lambda event, index=index: deliver(index, event),
                sampler=SamplerChain.from_registry(served.registry, spec),
                generator=make_generator(seed, device),
                logprobs=parsed.logprobs,
                prompt_logprobs=parsed.echo and parsed.logprobs is not None,
                model=parsed.model,
            )
            choices.append(Choice(index, prompt, job, RowText(served.tokenizer, prompt, parsed.stop)))
    return choices


def _take(choice: Choice, event: Event, eos: int | None) -> str:
    """Record an event of the choice's job; return the text it made final."""
    if isinstance(event, PromptScores):
        choice.prompt_scores = event.tokens
        return ""
    if isinstance(event, Finished):
        if choice.reason is None:
            choice.reason, choice.message = event.reason, event.message
        return ""
    if choice.reason is not None:  # ended by a stop string: the tokens after it are dropped
        return ""
    choice.tokens.append(event)
    if event.id == eos:
        return ""
    piece = choice.text.push(event.id)
    if choice.text.cut is not None:
        choice.reason = "stop"
        choice.job.cancel()
    return piece


def _logprobs(served: Served, tokens: list[Token], chat: bool) -> dict[str, Any]:
    """The tokens' log-probabilities in OpenAI's form for a completion, or for a chat."""
    decode = served.tokenizer.decode
    if chat:
        return {
            "content": [
                {
                    "token": decode([t.id]),
                    "logprob": t.logprob,
                    "bytes": list(decode([t.id]).encode()),
                    "top_logprobs": [
                        {"token": decode([i]), "logprob": lp, "bytes": list(decode([i]).encode())} for i, lp in t.top
                    ],
                }
                for t in tokens
            ]
        }
    texts = [decode([t.id]) for t in tokens]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [
            None if t.logprob is None else {decode([i]): lp for i, lp in t.top} if t.top else {} for t in tokens
        ],
        "text_offset": offsets,
    }


def _usage(choices: list[Choice], prompts: list[list[int]]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(c.tokens) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _failure(choices: list[Choice]) -> ApiError | None:
    failed = next((c for c in choices if c.reason == "error"), None)
    return None if failed is None else ApiError(500, f"generation failed: {failed.message}")


class Handler:
    """The routes of one server."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def models(self, request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": self.served.created, "owned_by": "gptzoo"}
            for name in self.served.names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        """Not OpenAI's: whether the server runs, and how many sequences run and wait."""
        engine = self.served.engine
        return JSONResponse({"status": "ok", "running": engine.running, "waiting": engine.waiting})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        served = self.served
        try:
            body = await _body(request, served.stopping)
            # Tokenizing and rendering a template take seconds on a large request: away from the event loop.
            parsed = await asyncio.to_thread(
                requests.parse,
                body,
                chat=chat,
                tokenizer=served.tokenizer,
                registry=served.registry,
                model_names=served.names,
                context=served.context,
            )
            queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
            loop = asyncio.get_running_loop()
            put = lambda i, e: loop.call_soon_threadsafe(queue.put_nowait, (i, e))  # noqa: E731
            choices = await asyncio.to_thread(_jobs, served, parsed, put)
        except ApiError as exc:
            return _error(exc)
        except GptzooError as exc:  # a sampler parameter, a chat template, a prompt's text
            return _error(ApiError(400, str(exc)))
        except ClientDisconnect:
            return Response(status_code=499)
        for choice in choices:
            try:
                served.engine.submit(choice.job)
            except GptzooError as exc:
                return _error(ApiError(503, str(exc)))
        name, created = parsed.model, int(time.time())
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        if parsed.stream:
            return StreamingResponse(
                self._stream(choices, queue, parsed, ident, name, created),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            await self._wait(request, choices, queue)
        finally:
            for choice in choices:
                choice.job.cancel()
        failure = _failure(choices)
        if failure is not None:
            return _error(failure)
        out = []
        for choice in choices:
            text, _ = choice.text.finish([t.id for t in choice.tokens], served.tokenizer.eos_token_id)
            entry: dict[str, Any] = {"index": choice.index, "finish_reason": choice.finish_reason}
            scored = [*(choice.prompt_scores if parsed.echo else ()), *choice.tokens]
            logprobs = None if parsed.logprobs is None else _logprobs(served, scored, chat)
            if chat:
                entry["message"] = {"role": "assistant", "content": text}
            else:
                entry["text"] = (served.tokenizer.decode(choice.prompt) if parsed.echo else "") + text
            entry["logprobs"] = logprobs
            out.append(entry)
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": name,
                "choices": out,
                "usage": _usage(choices, parsed.prompts),
            }
        )

    async def _wait(self, request: Request, choices: list[Choice], queue: asyncio.Queue[tuple[int, Event]]) -> None:
        """Take events until every choice's job has finished, or the client went away (then at once)."""
        eos = self.served.tokenizer.eos_token_id
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            finished = 0
            while finished < len(choices):
                event = asyncio.ensure_future(queue.get())
                await asyncio.wait({event, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not event.done():
                    event.cancel()
                    return
                index, taken = event.result()
                _take(choices[index], taken, eos)
                finished += isinstance(taken, Finished)
        finally:
            gone.cancel()

    async def _stream(
        self,
        choices: list[Choice],
        queue: asyncio.Queue[tuple[int, Event]],
        parsed: requests.Request,
        ident: str,
        name: str,
        created: int,
    ) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ending in ``data: [DONE]``; a client that goes away
        cancels the jobs (Starlette cancels this generator)."""
        served, chat = self.served, parsed.chat
        eos = served.tokenizer.eos_token_id

        def chunk(entries: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
            payload: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": name,
                "choices": entries,
            }
            if parsed.include_usage:
                payload["usage"] = usage
            return f"data: {json.dumps(payload)}\n\n"

        def entry(choice: Choice, text: str, reason: str | None, logprobs: Any = None) -> dict[str, Any]:
            out: dict[str, Any] = {"index": choice.index}
            if chat:
                out["delta"] = {"content": text} if text or reason is None else {}
            else:
                out["text"] = text
            out["logprobs"] = logprobs
            out["finish_reason"] = reason
            return out

        try:
            if chat:
                opening = {"role": "assistant", "content": ""}
                yield chunk(
                    [{"index": c.index, "delta": opening, "logprobs": None, "finish_reason": None} for c in choices]
                )
            elif parsed.echo:
                yield chunk([entry(c, served.tokenizer.decode(c.prompt), None) for c in choices])
            finished = 0
            while finished < len(choices):
                index, event = await queue.get()
                choice = choices[index]
                before = len(choice.tokens)
                piece = _take(choice, event, eos)
                if isinstance(event, Finished):
                    finished += 1
                    if event.reason == "error" and choice.reason == "error":
                        error = ApiError(500, f"generation failed: {event.message}")
                        yield f"data: {json.dumps(error.body())}\n\n"
                        continue
                    _, rest = choice.text.finish([t.id for t in choice.tokens], eos)
                    yield chunk([entry(choice, rest, choice.finish_reason)])
                    continue
                scored = choice.tokens[before:] if parsed.logprobs is not None else []
                if piece or scored:
                    yield chunk([entry(choice, piece, None, _logprobs(served, scored, chat) if scored else None)])
            if parsed.include_usage:
                yield chunk([], _usage(choices, parsed.prompts))
            yield "data: [DONE]\n\n"
        finally:
            for choice in choices:
                choice.job.cancel()


async def _disconnected(request: Request) -> None:
    """Return when the client of a request whose body was read goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    messages = {
        404: f"no route {request.url.path}; this server has /v1/models, /v1/completions and /v1/chat/completions",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    return _error(ApiError(status, messages.get(status, "the server failed"), kind="invalid_request_error"))


async def _crashed(request: Request, exc: Exception) -> Response:
    print(f"gptzoo serve: {request.method} {request.url.path} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return _error(ApiError(500, f"the server failed: {type(exc).__name__}: {exc}"))


def make_app(served: Served) -> Starlette:
    """The Starlette application; the engine runs while the application does."""
    handler = Handler(served)
    routes = [
        Route("/v1/models", handler.models, methods=["GET"]),
        Route("/health", handler.health, methods=["GET"]),
        Route("/v1/completions", handler.completions, methods=["POST"]),
        Route("/v1/chat/completions", handler.chat, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        served.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(served.engine.stop)  # the requests still running finish first

    return Starlette(
        routes=routes, exception_handlers={HTTPException: _not_found, Exception: _crashed}, lifespan=lifespan
    )

"""OpenAI's request bodies read and checked: what a completion or chat request asks for, or an
:class:`ApiError` with the status and message OpenAI's API gives for the same mistake.

Fields OpenAI defines are taken or refused as its API does (an unknown field is a 400, "Unrecognized
request argument supplied"); every sampler registered with a command-line flag (``gptzoo list
sampler``) is a field too, by its name (``temperature``, ``top_p``, and ``top_k``, ``min_p``,
``repetition_penalty`` as vLLM takes them), so a plugin's sampler is a request option with no server
code of its own. What a field leaves unset is the model recipe's [generate] chain, as for ``gptzoo
generate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gptzoo.inference.sampling import flagged
from gptzoo.registry import Registry
from gptzoo.tokenizer import Tokenizer

COMPLETION_DEFAULT_TOKENS = 16
"""OpenAI's default ``max_tokens`` of /v1/completions (a chat's default is what the context leaves)."""
MAX_CHOICES = 16
MAX_SEQUENCES = 256
"""The most sequences one request may ask for (prompts x n)."""
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 4
UNSUPPORTED_ZERO = ("presence_penalty", "frequency_penalty")
"""OpenAI fields taken only at their neutral value 0 (unless a registered sampler has their name)."""
IGNORED = ("user", "service_tier", "store", "metadata", "parallel_tool_calls")
"""OpenAI fields that change nothing here."""


class ApiError(Exception):
    """An error response: HTTP ``status`` and OpenAI's error object."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, kind: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class Request:
    """A checked completion or chat request."""

    chat: bool
    model: str
    """The served model's name the request gave."""
    prompts: list[list[int]]
    """Token ids of each prompt (a chat has one: the rendered messages)."""
    max_tokens: list[int]
    """Per prompt: the new tokens asked for, fitted to the context where the request named none."""
    n: int
    sampling: dict[str, float | int | None]
    """Registered sampler name -> the value its field gave."""
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None
    """None: none; k: each new token's and the k most likely ones'."""
    echo: bool


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{value!r} is not of type 'integer' - '{name}'", name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(f"Invalid '{name}': {value}; it must be {bound}.", name)
    return value


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{value!r} is not of type 'number' - '{name}'", name)
    return value


def _boolean(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{value!r} is not of type 'boolean' - '{name}'", name)
    return value


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _prompts(body: dict[str, Any], tokenizer: Tokenizer) -> list[list[int]]:
    """``prompt`` as OpenAI takes it: a string, strings, token ids, or lists of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        texts: list[Any] = [prompt]
    elif _ids(prompt):
        texts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _ids(p) for p in prompt):
        texts = prompt
    elif prompt is None:
        raise invalid("you must provide a prompt", "prompt")
    else:
        raise invalid("'prompt' must be a string, an array of strings, of tokens, or of token arrays", "prompt")
    prompts = []
    for text in texts:
        ids = tokenizer.encode(text) if isinstance(text, str) else list(text)
        if not ids:
            raise invalid("the prompt is empty (it encodes to no tokens)", "prompt")
        bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
        if bad is not None:
            raise invalid(f"token id {bad} is outside the vocabulary (0..{tokenizer.vocab_size - 1})", "prompt")
        prompts.append(ids)
    return prompts


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """``messages``: each a role and a content (a string, or text parts that are joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array of messages", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"messages[{i}] must be an object with a 'role'", f"messages.[{i}]")
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
            if any(not isinstance(p, str) for p in parts):
                raise invalid(f"messages[{i}].content: only text parts are supported", f"messages.[{i}].content")
            content = "".join(parts)
        if not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string or text parts", f"messages.[{i}].content")
        out.append({**{k: v for k, v in message.items() if k != "content"}, "content": content})
    return out


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("'stop' must be a non-empty string or an array of them", "stop")
    if len(stops) > MAX_STOPS:
        raise invalid(f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    return tuple(stops)


def parse(
    body: Any, *, chat: bool, tokenizer: Tokenizer, registry: Registry, model_names: tuple[str, ...], context: int
) -> Request:
    """The request ``body`` (parsed JSON) of /v1/completions (``chat`` False) or /v1/chat/completions.

    Raises:
        ApiError: a 400 naming the field and what is wrong with it, or a 404 for a model not served.
    """
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    samplers = {entry.name: flag for entry, flag in flagged(registry)}
    common = {"model", "max_tokens", "n", "stream", "stream_options", "stop", "seed", "logprobs", "logit_bias"}
    own = {"messages", "max_completion_tokens", "top_logprobs"} if chat else {"prompt", "echo", "best_of", "suffix"}
    known = common | own | set(samplers) | set(UNSUPPORTED_ZERO) | set(IGNORED)
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise invalid("you must provide a model parameter", "model")
    if model not in model_names:
        raise ApiError(
            404,
            f"The model `{model}` does not exist; this server has {', '.join(map(repr, model_names))}",
            param="model",
            code="model_not_found",
        )
    for name in UNSUPPORTED_ZERO:
        if name not in samplers and _number(body, name) not in (None, 0):
            raise invalid(f"'{name}' is not supported by this server (only 0); samplers: {', '.join(samplers)}", name)
    if body.get("logit_bias"):
        raise invalid("'logit_bias' is not supported by this server", "logit_bias")
    if not chat and _integer(body, "best_of", 1) not in (None, 1):
        raise invalid("'best_of' is not supported by this server (only 1)", "best_of")
    if not chat and body.get("suffix") is not None:
        raise invalid("'suffix' is not supported by this server", "suffix")
    sampling: dict[str, float | int | None] = {}
    for name, flag in samplers.items():
        value = _integer(body, name, 0) if flag.type is int else _number(body, name)
        sampling[name] = value
    temperature = sampling.get("temperature")
    if temperature is not None and not 0 <= temperature <= 2:
        raise invalid(f"Invalid 'temperature': {temperature}; it must be between 0 and 2.", "temperature")
    top_p = sampling.get("top_p")
    if top_p is not None and not 0 <= top_p <= 1:
        raise invalid(f"Invalid 'top_p': {top_p}; it must be between 0 and 1.", "top_p")
    if top_p == 0:  # OpenAI reads top_p 0 as only the most likely token
        sampling["top_p"], sampling["temperature"] = None, 0
    if chat:
        messages = _messages(body)
        if _boolean(body, "logprobs"):
            logprobs: int | None = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
        elif body.get("top_logprobs") is not None:
            raise invalid("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        else:
            logprobs = None
        asked = _integer(body, "max_completion_tokens", 1)
        asked = asked if asked is not None else _integer(body, "max_tokens", 1)
        echo = False
        prompts = [tokenizer.chat(messages)]  # last: the template is the checkpoint's code
    else:
        prompts = _prompts(body, tokenizer)
        logprobs = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        asked = _integer(body, "max_tokens", 0)
        echo = _boolean(body, "echo")
        if asked == 0 and not echo:
            raise invalid("Invalid 'max_tokens': 0; it must be at least 1.", "max_tokens")
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    if len(prompts) * n > MAX_SEQUENCES:
        raise invalid(
            f"{len(prompts)} prompts x n {n} ask for {len(prompts) * n} sequences; one request takes at most "
            f"{MAX_SEQUENCES}: send the prompts in several requests",
            "prompt",
        )
    max_tokens = [_fit(len(p), asked, chat=chat, context=context) for p in prompts]
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise invalid("'stream_options' is only allowed when 'stream' is true, as an object", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return Request(
        chat=chat,
        model=model,
        prompts=prompts,
        max_tokens=max_tokens,
        n=n,
        sampling=sampling,
        seed=_integer(body, "seed", 0, 2**63 - 1),
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        echo=echo,
    )


def _fit(prompt: int, asked: int | None, *, chat: bool, context: int) -> int:
    """The new tokens of a prompt of ``prompt`` tokens: what was asked (which must fit the context), else
    the default (a chat: what the context leaves)."""
    room = context - prompt
    where = "messages" if chat else "prompt"
    if room < 1 or (asked is not None and asked > room):
        wanted = prompt + (asked if asked is not None else 1)
        raise invalid(
            f"This model's maximum context length is {context} tokens. However, you requested {wanted} tokens "
            f"({prompt} in the {where}, {wanted - prompt} in the completion). Please reduce the length of the "
            f"{where} or the completion.",
            "max_tokens" if room >= 1 else where,
        )
    if asked is not None:
        return asked
    return room if chat else min(COMPLETION_DEFAULT_TOKENS, room)

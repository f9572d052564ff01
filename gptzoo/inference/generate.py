"""Generation for a caller: prompts checked, run through the decoding engine, and decoded to text.

:func:`generate` submits one job per prompt to a :class:`gptzoo.inference.engine.Engine` and runs it to
completion: the prompts are prefilled as one left-padded batch (the model gives every row its own
positions and hides the padding), then decoded one token per step, each chosen by a sampler chain
(greedy when none is given). A row stops at the EOS token or when the caller says so (stop strings,
see :func:`generate_text`); the batch stops when all rows have.

Whatever a user can get wrong is checked once, at the public edge (:func:`generate`,
:func:`generate_text`, :func:`plan_generation`), each a GptzooError naming it: seeds
(:func:`check_seed`), prompt texts (:func:`encode_prompts`), lengths (:func:`fit_new_tokens`), token
ids (:func:`check_prompts`) and the KV cache's memory (:func:`check_cache_memory`); the engine checks
the logits of every step (:func:`gptzoo.inference.engine.check_finite`).

On a CPU, decoding steps run as native calls (gptzoo.inference.decode_plan): the whole step as one
("native"), or, where some component has no lowering, native calls around that component's eager
forward ("native+eager"); else the model's eager forward decodes ("eager"). :class:`DecodePath`
(gptzoo.inference.paths) says which ran and why (``on_decode_path`` of :func:`generate`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptzoo.defaults import SEED_LIMIT
from gptzoo.errors import GptzooError, GptzooWarning
from gptzoo.inference.engine import Engine, Event, Finished, Job, Token
from gptzoo.inference.paths import DecodePath
from gptzoo.inference.sampling import SamplerChain, chain_spec
from gptzoo.memory import available_bytes, format_bytes
from gptzoo.model.gpt import GPT
from gptzoo.model.kv_cache import KVCache
from gptzoo.moves import moved
from gptzoo.recipe import GenerateSpec
from gptzoo.registry import Registry
from gptzoo.tokenizer import Tokenizer, shorten, utf8

CONTEXT_TOKENS = 4
"""Prompt tokens decoded before the new ones, so that their text reads as it does after the prompt."""

StepCallback = Callable[[list[int | None]], Sequence[int]]
"""Called after each step with each row's new token (None for a finished row); returns the rows to
stop now (e.g. because a stop string appeared)."""


def check_seed(seed: int | None) -> int | None:
    """``seed`` (``--seed``) when torch can take it: None or 0 <= seed < 2**64."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise GptzooError(f"--seed {seed!r} is out of range; give an integer from 0 to {SEED_LIMIT - 1} (2**64 - 1)")
    return seed


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on ``device`` seeded with ``seed`` (checked by :func:`check_seed`); None for None."""
    return None if check_seed(seed) is None else torch.Generator(device=device).manual_seed(seed)


def encode_prompts(tokenizer: Tokenizer, texts: Sequence[str], *, chat: bool = False) -> list[list[int]]:
    """The token ids of each ``--prompt`` text, wrapped in the chat template when ``chat``.

    Raises:
        GptzooError: an empty text, one that is not valid UTF-8 or encodes to no tokens, or ``chat``
            with a tokenizer that has no chat template.
    """
    prompts = []
    for text in texts:
        if not text:
            raise GptzooError("--prompt is empty; give some text")
        utf8(text, "--prompt")
        ids = tokenizer.chat([{"role": "user", "content": text}]) if chat else tokenizer.encode(text)
        if not ids:
            raise GptzooError(f"--prompt {shorten(text)} encodes to no tokens with the {tokenizer.name} tokenizer")
        prompts.append(ids)
    return prompts


def check_prompts(model: GPT, prompts: Sequence[Sequence[int]], tokenizer: Tokenizer | None = None) -> None:
    """Every prompt token is an id of the model (and of the tokenizer).

    Raises:
        GptzooError: naming the prompt, the id and the vocabularies.
    """
    vocab = model.wte.num_embeddings
    for row, prompt in enumerate(prompts, start=1):
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None and tokenizer is not None:
            raise GptzooError(
                f"prompt {row} has token id {bad}, outside the model's vocabulary (vocab_size {vocab}), while the "
                f"{tokenizer.name} tokenizer has {tokenizer.vocab_size} ids; give the model a vocab_size of at least "
                f"{tokenizer.vocab_size} or use the tokenizer it was trained with"
            )
        if bad is not None:
            raise GptzooError(f"prompt {row} has token id {bad}, outside the model's vocabulary (0..{vocab - 1})")
        bad = next((t for t in prompt if tokenizer is not None and t >= tokenizer.vocab_size), None)
        if bad is not None and tokenizer is not None:
            raise GptzooError(
                f"prompt {row} has token id {bad}, outside the {tokenizer.name} tokenizer's vocabulary "
                f"(0..{tokenizer.vocab_size - 1})"
            )


def check_lengths(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """Every prompt has tokens, and prompt + new tokens fit the positions the model encodes
    (GPT.position_limit); past the context it was trained at, one GptzooWarning (GPT.past_context)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise GptzooError("every prompt needs at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise GptzooError(f"the number of new tokens must be an integer >= 1, got {max_new_tokens!r}")
    longest, limit = max(len(p) for p in prompts), model.position_limit
    model.check_length(longest, f"a prompt of {longest} tokens", "shorten it")
    if limit is not None and longest == limit.positions:
        raise GptzooError(f"a prompt of {longest} tokens fills {limit}, leaving no room for new tokens; shorten it")
    if limit is not None and longest + max_new_tokens > limit.positions:
        raise GptzooError(
            f"{longest} prompt tokens + {max_new_tokens} new tokens exceed {limit}; "
            f"ask for at most {limit.positions - longest}"
        )
    warning = model.past_context(longest + max_new_tokens)
    if warning is not None:
        warnings.warn(warning, GptzooWarning, stacklevel=1)  # one place: shown once


def fit_new_tokens(
    model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, explicit: bool
) -> tuple[int, str | None]:
    """How many tokens to generate, and a note when that is fewer than asked.

    explicit: ``max_new_tokens`` is what the user gave (``--max-new-tokens``), which must fit the
        positions the model encodes (GPT.position_limit); otherwise it is the recipe's default, cut
        to what they leave after the longest prompt.

    Raises:
        GptzooError: a prompt that leaves no room, or an explicit number that does not fit.
    """
    longest, limit = max((len(p) for p in prompts), default=0), model.position_limit
    if limit is not None and 0 < longest < limit.positions < longest + max_new_tokens:
        fitted = limit.positions - longest
        if explicit:
            raise GptzooError(
                f"{longest} prompt tokens + {max_new_tokens} new tokens (--max-new-tokens) exceed {limit}; "
                f"ask for at most {fitted}"
            )
        check_lengths(model, prompts, fitted)
        return fitted, (
            f"generating at most {fitted} new tokens, not the recipe's max_new_tokens {max_new_tokens}: "
            f"{limit} hold {longest} prompt tokens; --max-new-tokens N sets it"
        )
    check_lengths(model, prompts, max_new_tokens)
    return max_new_tokens, None


def check_cache_memory(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """The KV cache of the prompts and ``max_new_tokens`` new tokens fits in the free memory of the
    model's device, as its attentions size it (their ``kv_bytes``, allocating nothing); unchecked
    where the free memory cannot be known. A model without a position limit (RoPE) takes any length.

    Raises:
        GptzooError: how much the cache needs and has, and what to ask for instead.
    """
    device = model.wte.weight.device
    free = available_bytes(device)
    if free is None:
        return
    longest = max(len(p) for p in prompts)
    dtype = model.wte.weight.dtype
    need = KVCache.bytes_needed((block.attn for block in model.blocks), len(prompts), longest + max_new_tokens, dtype)
    if need > free:
        rows = (
            f"{len(prompts)} prompts of up to {longest} tokens" if len(prompts) > 1 else f"a prompt of {longest} tokens"
        )
        raise GptzooError(
            f"{max_new_tokens} new tokens after {rows} need a KV cache of {format_bytes(need)}, but "
            f"{format_bytes(free)} of memory is available ({device}); ask for fewer new tokens "
            "(--max-new-tokens) or give fewer prompts"
        )


def generate(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampler: SamplerChain | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    on_step: StepCallback | None = None,
    vocab_size: int | None = None,
    on_decode_path: Callable[[DecodePath], None] | None = None,
) -> list[list[int]]:
    """The new tokens of each prompt (an EOS token ends its row and is included): one job per prompt,
    submitted together to a :class:`gptzoo.inference.engine.Engine` and run to their end.

    vocab_size: only ids below it are chosen (the tokenizer's, when the model's vocabulary is
        larger: padded, or trained on fewer ids); None: every id of the model.
    on_decode_path: called once, after the prefill, with the path the decoding steps take.

    Raises:
        GptzooError: a prompt that is empty, too long or holds an id the model lacks, a KV cache
            larger than the free memory, or logits that are not finite (:func:`check_finite`).
    """
    check_lengths(model, prompts, max_new_tokens)
    check_prompts(model, prompts)
    check_cache_memory(model, prompts, max_new_tokens)
    return _generate(
        model,
        prompts,
        max_new_tokens,
        sampler=sampler,
        generator=generator,
        eos_token_id=eos_token_id,
        on_step=on_step,
        vocab_size=vocab_size,
        on_decode_path=on_decode_path,
    )


def _generate(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampler: SamplerChain | None,
    generator: torch.Generator | None,
    eos_token_id: int | None,
    on_step: StepCallback | None,
    vocab_size: int | None,
    on_decode_path: Callable[[DecodePath], None] | None,
) -> list[list[int]]:
    """:func:`generate` of prompts already checked."""
    out: list[list[int]] = [[] for _ in prompts]
    new: list[int | None] = [None] * len(prompts)
    ends: list[Finished] = []

    def deliver(row: int, event: Event) -> None:
        if isinstance(event, Token):
            out[row].append(event.id)
            new[row] = event.id
        elif isinstance(event, Finished):
            ends.append(event)

    def after_step() -> None:
        for row in on_step(list(new)) if on_step is not None else ():
            jobs[row].cancel()
        new[:] = [None] * len(new)

    engine = Engine(
        model,
        eos_token_id=eos_token_id,
        vocab_size=vocab_size,
        max_batch=None,
        after_step=after_step,
        on_decode_path=on_decode_path,
    )
    jobs = [
        Job(list(p), max_new_tokens, lambda event, row=row: deliver(row, event), sampler=sampler, generator=generator)
        for row, p in enumerate(prompts)
    ]
    engine.submit(*jobs)
    engine.run()
    error = next((end.error for end in ends if end.error is not None), None)
    if error is not None:
        raise error
    return out


class IncrementalDecoder:
    """Text of a growing token list, never cutting a multi-byte character in half.

    Each new piece is the decoding of the last few tokens minus the decoding of those before it
    (as text-generation servers do), so tokenizers whose decode of a prefix is not a prefix of the
    decode (SentencePiece's leading spaces) still stream exactly the final text.
    """

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int] = ()) -> None:
        """context: the last tokens before the new ones (the prompt's), decoded but not emitted, so
        that the first new token decodes as it does after them (e.g. with its leading space)."""
        self.tokenizer = tokenizer
        self.tokens: list[int] = list(context)
        self.text = ""
        self._prefix = 0  # tokens[_prefix:_read] decode to the tail of text already emitted
        self._read = len(self.tokens)

    def push(self, token: int) -> str:
        """Add a token; return the text that became complete (may be empty)."""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self._prefix : self._read])
        after = self.tokenizer.decode(self.tokens[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):  # an incomplete UTF-8 sequence: wait
            return ""
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(self.tokens)
        self.text += new
        return new


class RowText:
    """The text of one row's new tokens, given out as it becomes final: a stop string ends it (and is
    cut), and the characters that may still become one are held back until they cannot."""

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int], stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.context = list(prompt[-CONTEXT_TOKENS:])
        self.decoder = IncrementalDecoder(tokenizer, self.context)
        self.stop = tuple(stop)
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.shown = 0
        """Characters given out so far."""
        self.cut: int | None = None
        """Where the first stop string starts in the text, once one appeared."""

    def push(self, token: int) -> str:
        """Add a new token (not EOS); return the text that became final."""
        self.decoder.push(token)
        text = self.decoder.text
        found = (text.find(s, max(0, self.shown - len(s))) for s in self.stop)
        cut = min((i for i in found if i >= 0), default=-1)
        if cut >= 0:
            self.cut = cut
        end = cut if cut >= 0 else max(self.shown, len(text) - self.hold)
        piece = text[self.shown : end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return piece

    def finish(self, tokens: Sequence[int], eos: int | None) -> tuple[str, str]:
        """The whole text of the new ``tokens`` (decoded at once, cut at the stop string) and the part of
        it not yet given out."""
        context = self.tokenizer.decode(self.context)
        text = self.tokenizer.decode(self.context + [t for t in tokens if t != eos])[len(context) :]
        if self.cut is not None:
            text = text[: self.cut]
        return text, text[self.shown :] if len(text) > self.shown else ""


@dataclass
class Generated:
    text: str
    tokens: list[int]
    finish_reason: str
    """"eos", "stop" (a stop string, cut from the text) or "length"."""


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampler: SamplerChain | None = None,
    generator: torch.Generator | None = None,
    stop: Sequence[str] = (),
    stream: Callable[[int, str], None] | None = None,
    on_decode_path: Callable[[DecodePath], None] | None = None,
) -> tuple[list[Generated], float]:
    """Generate and decode; ``stream(row, text)`` receives text as it becomes final, ``on_decode_path``
    the decoding path (:func:`generate`). Returns the results and the decoding speed in new tokens
    per second (prefill included)."""
    if any(not s for s in stop):
        raise GptzooError("a stop string is empty; give some text")
    check_prompts(model, prompts, tokenizer)
    check_lengths(model, prompts, max_new_tokens)
    check_cache_memory(model, prompts, max_new_tokens)
    return _generate_text(
        model,
        tokenizer,
        prompts,
        max_new_tokens,
        sampler,
        generator,
        stop,
        stream=stream,
        on_decode_path=on_decode_path,
    )


def _generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerChain | None,
    generator: torch.Generator | None,
    stop: Sequence[str],
    *,
    stream: Callable[[int, str], None] | None,
    on_decode_path: Callable[[DecodePath], None] | None,
) -> tuple[list[Generated], float]:
    """:func:`generate_text` of prompts already checked."""
    eos = tokenizer.eos_token_id
    rows = [RowText(tokenizer, prompt, stop) for prompt in prompts]

    def on_step(new: list[int | None]) -> list[int]:
        stopped = []
        for row, token in enumerate(new):
            if token is None or token == eos:
                continue
            piece = rows[row].push(token)
            if stream is not None and piece:
                stream(row, piece)
            if rows[row].cut is not None:
                stopped.append(row)
        return stopped

    start = time.perf_counter()
    tokens = _generate(
        model,
        prompts,
        max_new_tokens,
        sampler=sampler,
        generator=generator,
        eos_token_id=eos,
        on_step=on_step,
        vocab_size=tokenizer.vocab_size,
        on_decode_path=on_decode_path,
    )
    seconds = time.perf_counter() - start
    results = []
    for row, toks in enumerate(tokens):
        text, rest = rows[row].finish(toks, eos)
        if stream is not None and rest:
            stream(row, rest)
        reason = "stop" if rows[row].cut is not None else "eos" if toks and toks[-1] == eos else "length"
        results.append(Generated(text, toks, reason))
    return results, sum(len(t) for t in tokens) / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class GenerationPlan:
    """Everything one ``gptzoo generate`` needs, checked before the first token: run it with :meth:`run`."""

    model: GPT
    tokenizer: Tokenizer
    prompts: list[list[int]]
    sampler: SamplerChain
    generator: torch.Generator | None
    max_new_tokens: int
    stop: tuple[str, ...]
    note: str | None
    """Why fewer new tokens than the recipe's default are generated (the positions are full), if so."""

    def run(
        self,
        stream: Callable[[int, str], None] | None = None,
        on_decode_path: Callable[[DecodePath], None] | None = None,
    ) -> tuple[list[Generated], float]:
        """The decoded rows and new tokens per second; ``on_decode_path`` receives the :class:`DecodePath`
        (see :func:`generate_text`)."""
        self.model.eval()
        return _generate_text(
            self.model,
            self.tokenizer,
            self.prompts,
            self.max_new_tokens,
            self.sampler,
            self.generator,
            self.stop,
            stream=stream,
            on_decode_path=on_decode_path,
        )


def plan_generation(
    model: GPT,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    registry: Registry,
    chat: bool = False,
    max_new_tokens: int | None = None,
    sampling: Mapping[str, float | int | None] | None = None,
    samplers: Sequence[tuple[str, Mapping[str, Any]]] = (),
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> GenerationPlan:
    """Prompts encoded and their ids checked, the sampler chain resolved (the recipe's [generate]
    samplers with the ``sampling`` flags and the ``samplers`` steps (``--sampler``) of
    :func:`gptzoo.inference.sampling.chain_spec`), the seed
    checked, the number of new tokens fitted to the positions the model encodes (GPT.position_limit: the
    recipe's ``max_new_tokens`` is cut to what they leave, an explicit ``max_new_tokens`` must fit; past the
    context the model was trained at, one GptzooWarning) and the KV cache checked to fit
    in memory. Every problem is a GptzooError before any decoding.
    """
    recipe = model.recipe
    steps = [(c.name, c.kwargs) for c in recipe.generate.samplers] if recipe is not None else []
    chain = SamplerChain.from_registry(registry, chain_spec(steps, sampling or {}, registry=registry, given=samplers))
    generator = make_generator(seed, model.wte.weight.device)
    if any(not s for s in stop):
        raise GptzooError("--stop is empty; give some text")
    for s in stop:
        utf8(s, "--stop")
    prompts = encode_prompts(tokenizer, texts, chat=chat)
    check_prompts(model, prompts, tokenizer)
    default = recipe.generate.max_new_tokens if recipe is not None else GenerateSpec.max_new_tokens
    fitted, note = fit_new_tokens(model, prompts, max_new_tokens or default, explicit=max_new_tokens is not None)
    check_cache_memory(model, prompts, fitted)
    stops = (*(recipe.generate.stop if recipe is not None else ()), *stop)
    return GenerationPlan(model, tokenizer, prompts, chain, generator, fitted, stops, note)


def __getattr__(name: str) -> Any:
    """A name that moved to gptzoo.inference.engine or .paths (gptzoo.moves.MOVES), with one GptzooWarning."""
    return moved(__name__, name)

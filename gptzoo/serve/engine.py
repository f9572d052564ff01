"""Continuous batching: one thread runs the model for every request the server has.

A request (a :class:`Job`) is prefilled alone as soon as the batch has room, then joins the running
batch at the next decoding step; a sequence that ends (EOS, its token budget, a cancel from its client)
leaves it at once. Each keeps its own sampler chain, seeded generator and positions; the rows share one
KV cache (gptzoo.inference.batching.gather right-aligns them) and one decoding step, the native CPU step
where the model has one. Greedy rows give the tokens a lone ``gptzoo generate`` gives.

Events go to each job's ``deliver`` from the engine's thread: :class:`Token` for each new token (with
log-probabilities when asked), :class:`PromptScores` once after the prefill when the prompt's are asked
for, and :class:`Finished` last.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gptzoo.errors import GptzooError
from gptzoo.inference.batching import Row, gather, unbatchable
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.generate import check_finite
from gptzoo.inference.matvec import MAX_ROWS, native_decoding
from gptzoo.inference.sampling import SamplerChain
from gptzoo.memory import available_bytes, format_bytes
from gptzoo.model.gpt import GPT
from gptzoo.model.kv_cache import KVCache


@dataclass(frozen=True)
class Token:
    """A new token, its log-probability under the model and the most likely tokens' (when asked)."""

    id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class PromptScores:
    """The prompt's tokens with their log-probabilities (the first has none)."""

    tokens: tuple[Token, ...]


@dataclass(frozen=True)
class Finished:
    """The end of a job: ``"eos"``, ``"length"``, ``"cancelled"`` or ``"error"`` (with the message)."""

    reason: str
    message: str | None = None


Event = Token | PromptScores | Finished


@dataclass
class Job:
    """One sequence to generate: ``prompt`` then at most ``max_tokens`` new tokens."""

    prompt: list[int]
    max_tokens: int
    deliver: Callable[[Event], None]
    sampler: SamplerChain | None = None
    """None: greedy."""
    generator: torch.Generator | None = None
    logprobs: int | None = None
    """None: no log-probabilities; k: each new token's and the k most likely ones'."""
    prompt_logprobs: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop generating (the client went away, or a stop string appeared): the job leaves the batch."""
        self.cancelled.set()


@dataclass
class _Sequence:
    job: Job
    tokens: list[int]
    cache: KVCache
    index: int = 0
    """The row of ``cache`` that holds this sequence."""
    cached: int = 0
    """Positions in the cache: all tokens but the last."""
    generated: int = 0


class Engine:
    """The model's one decoding loop, in a thread of its own (:meth:`start`, :meth:`stop`)."""

    def __init__(
        self,
        model: GPT,
        *,
        eos_token_id: int | None,
        vocab_size: int | None = None,
        max_batch: int = 16,
        context: int,
    ) -> None:
        """vocab_size: only ids below it are chosen (the tokenizer's); context: the longest sequence served."""
        self.model = model.eval()
        self.eos = eos_token_id
        self.vocab_size = vocab_size
        self.context = context
        probe = model.init_cache(1, 1)
        self.unbatched = unbatchable(probe)
        """Why sequences run one at a time (None: they share a batch)."""
        self.max_batch = 1 if self.unbatched else self._fitting(max(1, min(max_batch, MAX_ROWS)))
        self._pending: deque[Job] = deque()
        self._active: list[_Sequence] = []
        self._cache: KVCache | None = None
        self._changed = False
        self._prefilling = 0
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gptzoo-engine", daemon=True)
        self.steps = 0
        """Decoding steps run so far (each one token for every row of the batch)."""

    def _fitting(self, rows: int) -> int:
        """The most rows (up to ``rows``) whose caches of :attr:`context` positions fit in free memory, twice
        (a batch's cache is rebuilt beside the old one)."""
        device = self.model.wte.weight.device
        free = available_bytes(device)
        attentions = [block.attn for block in self.model.blocks]
        dtype = self.model.wte.weight.dtype
        while free is not None and rows > 1 and 2 * KVCache.bytes_needed(attentions, rows, self.context, dtype) > free:
            rows //= 2
        return rows

    def describe(self) -> str:
        """One line for the person who started the server."""
        if self.unbatched:
            return f"one sequence at a time: {self.unbatched}"
        bytes_ = KVCache.bytes_needed(
            (b.attn for b in self.model.blocks), self.max_batch, self.context, self.model.wte.weight.dtype
        )
        return f"continuous batching of up to {self.max_batch} sequences (KV cache at most {format_bytes(bytes_)})"

    @property
    def running(self) -> int:
        """Sequences in the batch now (or being prefilled to join it)."""
        return len(self._active) + self._prefilling

    @property
    def waiting(self) -> int:
        """Sequences queued for a row."""
        return len(self._pending)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; it joins the batch at the next step with room (refused once stopping)."""
        with self._wake:
            if self._stopping:
                raise GptzooError("the server is shutting down")
            self._pending.append(job)
            self._wake.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued and running job, then end the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._pending or self._active or self._stopping):
                    self._wake.wait()
                if self._stopping and not (self._pending or self._active):
                    return
            try:
                self._admit()
                if self._active:
                    self._decode()
            except Exception as exc:  # a broken step fails its jobs, never the server
                message = str(exc) if isinstance(exc, GptzooError) else f"{type(exc).__name__}: {exc}"
                for seq in self._active:
                    seq.job.deliver(Finished("error", message))
                self._active, self._cache, self._changed = [], None, False

    def _room(self) -> bool:
        return bool(self._pending) and len(self._active) < self.max_batch

    @torch.no_grad()
    def _admit(self) -> None:
        """Prefill queued jobs while the batch has room (torch on all its threads)."""
        while True:
            with self._wake:
                if not self._room():
                    return
                job = self._pending.popleft()
            if job.cancelled.is_set():
                job.deliver(Finished("cancelled"))
                continue
            self._prefilling = 1
            try:
                seq = self._prefill(job)
            except GptzooError as exc:
                job.deliver(Finished("error", str(exc)))
                continue
            finally:
                self._prefilling = 0
            if seq is not None:
                self._active.append(seq)
                self._changed = True

    def _prefill(self, job: Job) -> _Sequence | None:
        device = self.model.wte.weight.device
        cache = self.model.init_cache(1, len(job.prompt) + job.max_tokens)
        ids = torch.tensor([job.prompt], device=device)
        logits = self.model(ids, cache, logits_to_keep=None if job.prompt_logprobs else 1)[0]
        if job.prompt_logprobs:
            scores = self._scores(logits[:-1], ids[0, 1:], job.logprobs or 0)
            job.deliver(PromptScores((Token(job.prompt[0]), *scores)))
        if job.max_tokens == 0:  # only the prompt's scores were asked for
            job.deliver(Finished("length"))
            return None
        if job.sampler is not None:
            job.sampler.reset()
        seq = _Sequence(job, list(job.prompt), cache, cached=len(job.prompt))
        return None if self._choose(seq, logits[-1]) else seq

    def _scores(self, logits: Tensor, ids: Tensor, top: int) -> list[Token]:
        """The tokens ``ids`` (T,) with their log-probabilities under ``logits`` (T, V) and the ``top`` best."""
        logp = self._limited(logits).float().log_softmax(-1)
        chosen = logp.gather(-1, ids[:, None])[:, 0].tolist()
        best = logp.topk(top, dim=-1) if top else None
        tokens = []
        for t, token in enumerate(ids.tolist()):
            pairs = zip(best.indices[t].tolist(), best.values[t].tolist(), strict=True) if best is not None else ()
            tokens.append(Token(token, chosen[t], tuple(pairs)))
        return tokens

    def _limited(self, logits: Tensor) -> Tensor:
        """Logits (..., V) with the ids the tokenizer lacks never chosen."""
        limit = self.vocab_size
        if limit is None or limit >= logits.shape[-1]:
            return logits
        logits = logits.float().clone()
        logits[..., limit:] = float("-inf")
        return logits

    def _choose(self, seq: _Sequence, logits: Tensor) -> bool:
        """Pick the next token of ``seq`` from its logits (V,) and hand it over; True when the sequence ended."""
        job = seq.job
        if job.cancelled.is_set():
            job.deliver(Finished("cancelled"))
            return True
        row = logits[None]
        check_finite(row[:, : self.vocab_size], seq.generated)
        row = self._limited(row)
        if job.sampler is None:
            token = int(row.float().argmax(dim=-1))
        else:
            history = torch.tensor([seq.tokens], device=row.device)
            token = int(job.sampler(row, history, job.generator)[0])
        if job.logprobs is not None:
            event = self._scores(row, torch.tensor([token], device=row.device), job.logprobs)[0]
        else:
            event = Token(token)
        seq.tokens.append(token)
        seq.generated += 1
        job.deliver(event)
        if token == self.eos:
            job.deliver(Finished("eos"))
            return True
        if seq.generated >= job.max_tokens:
            job.deliver(Finished("length"))
            return True
        return False

    def _rebuild(self) -> None:
        """One cache for the rows running now, each right-aligned, with room for every row's last token."""
        rows = [Row(seq.cache, seq.index, seq.cached) for seq in self._active]
        capacity = max(seq.cached + seq.job.max_tokens - seq.generated for seq in self._active)
        if len(rows) == 1 and rows[0].cache.key_mask is None and rows[0].cache.length == rows[0].length:
            self._cache = rows[0].cache  # a lone sequence keeps its own cache
        else:
            self._cache = gather(self.model, rows, capacity)
        for i, seq in enumerate(self._active):
            seq.cache, seq.index = self._cache, i
        self._changed = False

    @torch.no_grad()
    def _decode(self) -> None:
        """Decoding steps for the running rows until one joins or leaves."""
        if self._changed:
            self._rebuild()
        cache = self._cache
        assert cache is not None
        batch = len(self._active)
        device = self.model.wte.weight.device
        with native_decoding(self.model) as tuner:
            step = compile_step(self.model, cache, batch, split=True)[0] if tuner is not None else None
            while self._active and not self._changed:
                with self._wake:
                    if self._room():
                        return
                tokens = torch.tensor([[seq.tokens[-1]] for seq in self._active], device=device)
                begun = time.perf_counter()
                logits = (step(tokens) if step is not None else self.model(tokens, cache))[:, -1]
                if tuner is not None:
                    tuner.record(time.perf_counter() - begun)
                self.steps += 1
                ended = []
                for i, seq in enumerate(self._active):
                    seq.cached += 1
                    if self._finish_or_continue(seq, logits[i]):
                        ended.append(seq)
                if ended:
                    self._active = [seq for seq in self._active if seq not in ended]
                    self._changed = True

    def _finish_or_continue(self, seq: _Sequence, logits: Tensor) -> bool:
        try:
            return self._choose(seq, logits)
        except GptzooError as exc:  # this row's logits or sampler: only this request fails
            seq.job.deliver(Finished("error", str(exc)))
            return True


def run_alone(engine: Engine, jobs: Sequence[Job]) -> None:
    """Submit ``jobs`` and wait until each has finished (for scripts and tests; the server streams)."""
    done = threading.Semaphore(0)
    for job in jobs:
        deliver = job.deliver

        def relay(event: Event, deliver: Callable[[Event], None] = deliver) -> None:
            deliver(event)
            if isinstance(event, Finished):
                done.release()

        job.deliver = relay
        engine.submit(job)
    for _ in jobs:
        done.acquire()

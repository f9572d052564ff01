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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gptzoo.errors import GptzooError, describe_exception
from gptzoo.inference.batching import Row, gather, unbatchable
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.generate import check_finite, within_vocab
from gptzoo.inference.matvec import MAX_ROWS, native_decoding
from gptzoo.inference.sampling import SamplerChain
from gptzoo.memory import available_bytes, format_bytes
from gptzoo.model.gpt import GPT
from gptzoo.model.kv_cache import KVCache
from gptzoo.registry import default_registry


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
    model: str = ""
    """The name of the engine's model to run on (with one model: ignored)."""
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


TURN_STEPS = 8
"""Decoding steps one model's batch runs before another model with running sequences gets its turn."""


class _Lane:
    """One model's batch: its running sequences and their cache."""

    def __init__(self, model: GPT, max_batch: int) -> None:
        self.model = model.eval()
        self.registry = getattr(model, "registry", None) or default_registry()
        self.unbatched = unbatchable(model.init_cache(1, 1), self.registry)
        """Why its sequences run one at a time (None: they share a batch)."""
        self.max_batch = 1 if self.unbatched else max(1, min(max_batch, MAX_ROWS))
        self.active: list[_Sequence] = []
        self.cache: KVCache | None = None
        self.changed = False

    def kv_bytes(self, rows: int, context: int) -> int:
        attentions = [block.attn for block in self.model.blocks]
        return KVCache.bytes_needed(attentions, rows, context, self.model.wte.weight.dtype)


class Engine:
    """The models' one decoding loop, in a thread of its own (:meth:`start`, :meth:`stop`).

    ``models`` maps the names requests give to models (one model: any name reaches it): each has a batch
    of its own, and batches with running sequences take turns of :data:`TURN_STEPS` steps.
    """

    def __init__(
        self,
        models: GPT | Mapping[str, GPT],
        *,
        eos_token_id: int | None,
        vocab_size: int | None = None,
        max_batch: int = 16,
        context: int,
    ) -> None:
        """vocab_size: only ids below it are chosen (the tokenizer's); context: the longest sequence served."""
        named = {"": models} if isinstance(models, GPT) else dict(models)
        self.eos = eos_token_id
        self.vocab_size = vocab_size
        self.context = context
        self._lanes = {name: _Lane(model, max_batch) for name, model in named.items()}
        self._fit_memory()
        self._pending: deque[Job] = deque()
        self._prefilling = 0
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gptzoo-engine", daemon=True)
        self.steps = 0
        """Decoding steps run so far (each one token for every row of a batch)."""

    def _fit_memory(self) -> None:
        """Halve the batches until every one's cache of :attr:`context` positions fits in free memory
        twice (a batch's cache is rebuilt beside the old one)."""
        lanes = list(self._lanes.values())
        free = available_bytes(lanes[0].model.wte.weight.device)
        while free is not None and any(lane.max_batch > 1 for lane in lanes):
            if 2 * sum(lane.kv_bytes(lane.max_batch, self.context) for lane in lanes) <= free:
                return
            for lane in lanes:
                lane.max_batch = max(1, lane.max_batch // 2)

    @property
    def unbatched(self) -> str | None:
        """Why some model's sequences run one at a time (None: every model batches them)."""
        return next((lane.unbatched for lane in self._lanes.values() if lane.unbatched), None)

    @property
    def max_batch(self) -> int:
        """The most sequences one model's batch runs at once."""
        return min(lane.max_batch for lane in self._lanes.values())

    def describe(self) -> str:
        """One line for the person who started the server."""
        if self.unbatched:
            return f"one sequence at a time: {self.unbatched}"
        kv = sum(lane.kv_bytes(lane.max_batch, self.context) for lane in self._lanes.values())
        each = f"{len(self._lanes)} batches of" if len(self._lanes) > 1 else ""
        return f"continuous batching of {each} up to {self.max_batch} sequences (KV cache at most {format_bytes(kv)})"

    @property
    def running(self) -> int:
        """Sequences in the batches now (or being prefilled to join one)."""
        return sum(len(lane.active) for lane in self._lanes.values()) + self._prefilling

    @property
    def waiting(self) -> int:
        """Sequences queued for a row."""
        return len(self._pending)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; it joins its model's batch at the next step with room (refused once stopping).

        Raises:
            GptzooError: the engine is stopping, or has no model of the job's name.
        """
        if job.model not in self._lanes and len(self._lanes) > 1:
            raise GptzooError(f"no model {job.model!r} is served; models: {', '.join(self._lanes)}")
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

    def _lane(self, job: Job) -> _Lane:
        return self._lanes[job.model] if job.model in self._lanes else next(iter(self._lanes.values()))

    def _busy(self) -> list[_Lane]:
        return [lane for lane in self._lanes.values() if lane.active]

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._pending or self._busy() or self._stopping):
                    self._wake.wait()
                if self._stopping and not (self._pending or self._busy()):
                    return
            self._admit()
            busy = self._busy()
            for lane in busy:
                try:
                    self._decode(lane, None if len(busy) == 1 else TURN_STEPS)
                except Exception as exc:  # a broken step fails its batch's jobs, never the server
                    for seq in lane.active:
                        seq.job.deliver(Finished("error", describe_exception(exc)))
                    lane.active, lane.cache, lane.changed = [], None, False

    def _fits(self, job: Job) -> bool:
        """The job's model's batch has a free row."""
        lane = self._lane(job)
        return len(lane.active) < lane.max_batch

    def _room(self) -> bool:
        """A queued job whose model's batch has a free row."""
        return any(self._fits(job) for job in self._pending)

    @torch.no_grad()
    def _admit(self) -> None:
        """Prefill queued jobs while their batches have room (torch on all its threads)."""
        while True:
            with self._wake:
                job = next((j for j in self._pending if self._fits(j)), None)
                if job is None:
                    return
                self._pending.remove(job)
            if job.cancelled.is_set():
                job.deliver(Finished("cancelled"))
                continue
            lane = self._lane(job)
            self._prefilling = 1
            try:
                seq = self._prefill(lane.model, job)
            except Exception as exc:  # this prompt's failure fails this job only
                job.deliver(Finished("error", describe_exception(exc)))
                continue
            finally:
                self._prefilling = 0
            if seq is not None:
                lane.active.append(seq)
                lane.changed = True

    def _prefill(self, model: GPT, job: Job) -> _Sequence | None:
        device = model.wte.weight.device
        cache = model.init_cache(1, len(job.prompt) + job.max_tokens)
        ids = torch.tensor([job.prompt], device=device)
        logits = model(ids, cache, logits_to_keep=None if job.prompt_logprobs else 1)[0]
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
        logp = within_vocab(logits, self.vocab_size).float().log_softmax(-1)
        chosen = logp.gather(-1, ids[:, None])[:, 0].tolist()
        best = logp.topk(top, dim=-1) if top else None
        tokens = []
        for t, token in enumerate(ids.tolist()):
            pairs = zip(best.indices[t].tolist(), best.values[t].tolist(), strict=True) if best is not None else ()
            tokens.append(Token(token, chosen[t], tuple(pairs)))
        return tokens

    def _choose(self, seq: _Sequence, logits: Tensor) -> bool:
        """Pick the next token of ``seq`` from its logits (V,) and hand it over; True when the sequence ended."""
        job = seq.job
        if job.cancelled.is_set():
            job.deliver(Finished("cancelled"))
            return True
        row = logits[None]
        check_finite(row[:, : self.vocab_size], seq.generated)
        row = within_vocab(row, self.vocab_size)
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

    def _rebuild(self, lane: _Lane) -> None:
        """One cache for a batch's running rows, each right-aligned, with room for every row's last token."""
        rows = [Row(seq.cache, seq.index, seq.cached) for seq in lane.active]
        capacity = max(seq.cached + seq.job.max_tokens - seq.generated for seq in lane.active)
        if len(rows) == 1 and rows[0].cache.key_mask is None and rows[0].cache.length == rows[0].length:
            lane.cache = rows[0].cache  # a lone sequence keeps its own cache
        else:
            lane.cache = gather(lane.model, rows, capacity, lane.registry)
        for i, seq in enumerate(lane.active):
            seq.cache, seq.index = lane.cache, i
        lane.changed = False

    @torch.no_grad()
    def _decode(self, lane: _Lane, turn: int | None) -> None:
        """Decoding steps for a batch's rows until one joins or leaves, or ``turn`` steps have run."""
        if lane.changed:
            self._rebuild(lane)
        cache = lane.cache
        assert cache is not None
        model, batch, done = lane.model, len(lane.active), 0
        device = model.wte.weight.device
        with native_decoding(model) as tuner:
            step = compile_step(model, cache, batch, split=True)[0] if tuner is not None else None
            while lane.active and not lane.changed and (turn is None or done < turn):
                with self._wake:
                    if self._room():
                        return
                tokens = torch.tensor([[seq.tokens[-1]] for seq in lane.active], device=device)
                begun = time.perf_counter()
                logits = (step(tokens) if step is not None else model(tokens, cache))[:, -1]
                if tuner is not None:
                    tuner.record(time.perf_counter() - begun)
                self.steps += 1
                done += 1
                ended = []
                for i, seq in enumerate(lane.active):
                    seq.cached += 1
                    if self._finish_or_continue(seq, logits[i]):
                        ended.append(seq)
                if ended:
                    lane.active = [seq for seq in lane.active if seq not in ended]
                    lane.changed = True

    def _finish_or_continue(self, seq: _Sequence, logits: Tensor) -> bool:
        try:
            return self._choose(seq, logits)
        except GptzooError as exc:  # this row's logits or sampler: only this request fails
            seq.job.deliver(Finished("error", str(exc)))
            return True

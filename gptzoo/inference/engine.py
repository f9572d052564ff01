"""The decoding engine: every generation gptzoo runs goes through one :class:`Engine` (``generate``, the
evaluation harness through it, and ``gptzoo serve``), so the decoding step is written once, here.

Jobs (a prompt and a budget of new tokens each) are submitted, admitted while their model's batch has
room, prefilled (the jobs admitted together as one left-padded batch, one forward), then decoded together,
one token for every row per step, until each ends: at EOS, at its budget, or when it is cancelled.
``generate()`` submits one job per prompt and runs the engine to completion in its own thread
(:meth:`Engine.run`); the server runs the same loop in a thread of the engine's (:meth:`Engine.start`) and
submits jobs as requests arrive.

Draws. The jobs of one :meth:`Engine.submit` that share a sampler chain (the same object) are drawn by one
call of it on their rows, with their tokens so far as one left-padded batch, as a batch of prompts has
always been sampled: a seeded batch gives the same tokens whatever else runs beside it. A row whose job
ended stays in its draw (drawn for, and discarded) while the draw has running rows.

Joins and leaves. The rows of a batch share one cache, each right-aligned (gptzoo.inference.batching).
A join costs a rebuild of that cache: a copy of every kept row's positions (rows x positions x layers
of keys and values) and a new plan of the native step. A leave costs nothing at once: the row stays in
the batch, computed and ignored, until the next rebuild, which comes with the next join, when the cache
is full while rows still need room, or when the rows of ended draws outnumber the others. A model whose
layer caches cannot move rows (no mover for their class) runs one admission at a time, to its end; so
does one whose mover failed, from then on (the rows already running go on).

Events go to each job's ``deliver``, from the thread that runs the engine: a :class:`Token` for each new
token (with log-probabilities when asked), :class:`PromptScores` once after the prefill when the prompt's
are asked for, and :class:`Finished` last.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gptzoo.errors import GptzooError, PluginError, describe_exception
from gptzoo.inference.batching import Row, gather, unbatchable
from gptzoo.inference.decode_plan import CompiledStep, compile_step
from gptzoo.inference.matvec import MAX_ROWS, native_decoding
from gptzoo.inference.paths import DecodePath, decode_path, why_eager
from gptzoo.inference.sampling import SamplerChain, prompts_of
from gptzoo.memory import available_bytes, format_bytes
from gptzoo.model.gpt import GPT
from gptzoo.model.kv_cache import KVCache
from gptzoo.registry import default_registry


def check_finite(logits: Tensor, step: int) -> None:
    """The model's next-token logits (B, V) are finite numbers.

    Raises:
        GptzooError: naming the new token (from 1) and the prompts whose logits are NaN or infinite.
    """
    if logits.sum(-1, dtype=torch.float32).isfinite().all():  # one pass; NaN and infinity propagate
        return
    broken = ~logits.isfinite().all(dim=-1)  # or a sum that overflowed: then look at each logit
    if broken.any():
        dtype = str(logits.dtype).removeprefix("torch.")
        hint = "" if logits.dtype == torch.float32 else f", or its activations overflow {dtype} (try float32)"
        raise GptzooError(
            f"new token {step + 1}: the model's logits for {prompts_of(broken)} are not finite (NaN or infinity): "
            f"its weights hold NaN or infinity (e.g. from a diverged training run){hint}; check the weights"
        )


def within_vocab(logits: Tensor, vocab_size: int | None) -> Tensor:
    """Logits (..., V) where the ids from ``vocab_size`` on (those the tokenizer cannot decode) are never
    chosen: a float32 copy with them at -inf; ``logits`` itself when None or V is not larger."""
    if vocab_size is None or vocab_size >= logits.shape[-1]:
        return logits
    limited = logits.to(torch.float32, copy=True)
    limited[..., vocab_size:] = float("-inf")
    return limited


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
    """The end of a job: ``"eos"``, ``"length"``, ``"cancelled"`` or ``"error"`` (with the message, and the
    exception, which ``generate`` raises again)."""

    reason: str
    message: str | None = None
    error: BaseException | None = field(default=None, compare=False, repr=False)


Event = Token | PromptScores | Finished


@dataclass(eq=False)
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
    finished: bool = field(default=False, init=False)
    """Its :class:`Finished` has been delivered (it is delivered once)."""
    failure: str | None = field(default=None, init=False)
    """Why it was cancelled, when that is an error (the server stopping); None: a plain cancel."""

    def cancel(self, failure: str | None = None) -> None:
        """Stop generating (the client went away, or a stop string appeared): the job ends at the next step,
        ``"cancelled"``, or ``"error"`` with ``failure`` when one is given."""
        self.failure = self.failure or failure
        self.cancelled.set()

    def cancelled_event(self) -> Finished:
        """The :class:`Finished` of a cancelled job."""
        return Finished("cancelled") if self.failure is None else Finished("error", self.failure)


@dataclass(eq=False)
class _Sequence:
    job: Job
    cached: int
    """Positions this row holds in its cache: every token fed so far."""
    last: int = 0
    """The token fed at the next step."""
    generated: int = 0

    @property
    def ended(self) -> bool:
        return self.job.finished


def left_padded(prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor | None]:
    """(B, T) the prompts left-padded by repeating each row's first token (harmless under the attention mask,
    and what a sampler step counting the history skips), and (B, T) False at that padding (None: no padding)."""
    longest = max(len(p) for p in prompts)
    tokens = torch.tensor([[p[0]] * (longest - len(p)) + list(p) for p in prompts], device=device)
    if all(len(p) == longest for p in prompts):
        return tokens, None
    return tokens, torch.tensor([[False] * (longest - len(p)) + [True] * len(p) for p in prompts], device=device)


def drawing(draws: Iterable[_Draw]) -> bool:
    """Whether any of the draws still has a running row."""
    return any(d.running for d in draws)


class _Draw:
    """Rows drawn by one call of their sampler chain (greedy rows: one argmax), with their tokens so far."""

    def __init__(
        self,
        seqs: list[_Sequence],
        sampler: SamplerChain | None,
        generator: torch.Generator | None,
        device: torch.device,
    ) -> None:
        self.seqs, self.sampler, self.generator, self.device = seqs, sampler, generator, device
        self.steps = 0
        self.rows: Tensor | None = None
        """The rows of the batch that hold :attr:`seqs`, in order (None: the whole batch is theirs, in order)."""
        self.history: Tensor | None = None
        """(G, T) every token so far, left-padded by repeating a row's first token (for the sampler)."""
        self.real: Tensor | None = None
        """(G, T) False at that padding; None without padding."""
        if sampler is not None:
            self.history, self.real = left_padded([s.job.prompt for s in seqs], device)
            sampler.reset()

    @property
    def running(self) -> bool:
        return any(not s.ended for s in self.seqs)

    @property
    def remaining(self) -> int:
        """The most steps a running row of it still takes (0: it has ended)."""
        return max((s.job.max_tokens - s.generated for s in self.seqs if not s.ended), default=0)

    def place(self, batch: Sequence[_Sequence]) -> None:
        """Find the draw's rows in ``batch``, the sequences of a batch's rows in order."""
        index = {id(seq): i for i, seq in enumerate(batch)}
        rows = [index[id(seq)] for seq in self.seqs]
        self.rows = None if rows == list(range(len(batch))) else torch.tensor(rows, device=self.device)

    def logits(self, batch: Tensor) -> Tensor:
        """The draw's rows (G, V) of a batch's logits (B, V)."""
        return batch if self.rows is None else batch.index_select(0, self.rows)


@dataclass(eq=False)
class _Admission:
    """The jobs of one :meth:`Engine.submit`: admitted together, to one model's batch."""

    jobs: list[Job]
    lane: _Lane


@dataclass(eq=False)
class _Prefilled:
    """A prefilled batch: its cache, its rows and their draws (parked while its rows cannot join its model's
    running batch)."""

    cache: KVCache
    seqs: list[_Sequence]
    draws: list[_Draw]


TURN_STEPS = 8
"""Decoding steps one model's batch runs before another model with running sequences gets its turn."""


class _Lane:
    """One model's batch: its rows (in the order of its cache's rows), their draws and their cache."""

    def __init__(self, model: GPT, max_batch: int | None) -> None:
        self.model = model
        self.registry = getattr(model, "registry", None) or default_registry()
        self.unbatched = unbatchable(model.init_cache(1, 1), self.registry)
        """Why its rows cannot join a running batch (None: they can)."""
        self.max_batch = None if max_batch is None else 1 if self.unbatched else max(1, min(max_batch, MAX_ROWS))
        """The most rows it runs at once (None: any number)."""
        self.rows: list[_Sequence] = []
        self.draws: list[_Draw] = []
        self.cache: KVCache | None = None
        self.step: CompiledStep | None = None
        self.stale = False
        """The rows must be gathered anew before the next step (a cache full, ended draws in the majority)."""
        self.parked: deque[_Prefilled] = deque()

    @property
    def running(self) -> bool:
        return drawing(self.draws) or bool(self.parked)

    @property
    def occupied(self) -> int:
        """Rows that count against :attr:`max_batch`: those of running draws, and parked ones."""
        return sum(len(d.seqs) for d in self.draws if d.running) + sum(len(p.seqs) for p in self.parked)

    def kv_bytes(self, rows: int, context: int) -> int:
        attentions = [block.attn for block in self.model.blocks]
        return KVCache.bytes_needed(attentions, rows, context, self.model.wte.weight.dtype)


class Engine:
    """The models' one decoding loop: run to completion in the caller's thread (:meth:`run`), or in a thread
    of its own while jobs arrive (:meth:`start`, :meth:`stop`).

    ``models`` maps the names jobs give to models (one model: any name reaches it): each has a batch of its
    own, and batches with running sequences take turns of :data:`TURN_STEPS` steps.
    """

    def __init__(
        self,
        models: GPT | Mapping[str, GPT],
        *,
        eos_token_id: int | None,
        vocab_size: int | None = None,
        max_batch: int | None = 16,
        context: int | None = None,
        after_step: Callable[[], None] | None = None,
        on_decode_path: Callable[[DecodePath], None] | None = None,
    ) -> None:
        """vocab_size: only ids below it are chosen (the tokenizer's); max_batch: the most rows a batch runs
        (None: any number, one admission at a time); context: the longest sequence served, which the batches
        are sized for in free memory (None: unchecked); after_step: called after each step's tokens were
        delivered (a job it cancels ends before the next forward); on_decode_path: called with the path each
        new batch's step takes."""
        named = dict(models) if isinstance(models, Mapping) else {"": models}
        self.eos = eos_token_id
        self.vocab_size = vocab_size
        self.context = context
        self.after_step = after_step
        self.on_decode_path = on_decode_path
        self._lanes = {name: _Lane(model, max_batch) for name, model in named.items()}
        self._fit_memory()
        self._pending: deque[_Admission] = deque()
        self._admitted = 0
        """Jobs admitted (prefilling, running or parked) that have not finished."""
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="gptzoo-engine", daemon=True)
        self.steps = 0
        """Decoding steps run so far (each one token for every row of a batch)."""

    def _fit_memory(self) -> None:
        """Halve the batches until every one's cache of :attr:`context` positions fits in free memory
        twice (a batch's cache is rebuilt beside the old one)."""
        lanes = [lane for lane in self._lanes.values() if lane.max_batch is not None]
        if self.context is None or not lanes:
            return
        free = available_bytes(lanes[0].model.wte.weight.device)
        while free is not None and any(lane.max_batch > 1 for lane in lanes):  # type: ignore[operator]
            if 2 * sum(lane.kv_bytes(lane.max_batch, self.context) for lane in lanes) <= free:  # type: ignore[arg-type]
                return
            for lane in lanes:
                lane.max_batch = max(1, lane.max_batch // 2)  # type: ignore[operator]

    @property
    def unbatched(self) -> str | None:
        """Why some model's sequences run one at a time (None: every model batches them)."""
        return next((lane.unbatched for lane in self._lanes.values() if lane.unbatched), None)

    @property
    def max_batch(self) -> int | None:
        """The most sequences one model's batch runs at once (None: any number)."""
        sizes = [lane.max_batch for lane in self._lanes.values() if lane.max_batch is not None]
        return min(sizes) if sizes else None

    def describe(self) -> str:
        """One line for the person who started the server."""
        if self.unbatched:
            return f"one sequence at a time: {self.unbatched}"
        context = self.context or 0
        kv = sum(lane.kv_bytes(lane.max_batch or 1, context) for lane in self._lanes.values())
        each = f"{len(self._lanes)} batches of " if len(self._lanes) > 1 else ""
        return f"continuous batching of {each}up to {self.max_batch} sequences (KV cache at most {format_bytes(kv)})"

    @property
    def running(self) -> int:
        """Sequences in the batches now (or being prefilled to join one)."""
        return self._admitted

    @property
    def waiting(self) -> int:
        """Sequences queued for a row."""
        return sum(len(a.jobs) for a in self._pending)

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, *jobs: Job) -> None:
        """Queue jobs, admitted together (prefilled as one batch) once their model's batch has room for all.

        Raises:
            GptzooError: the engine is stopping, it has no model of a job's name, the jobs name different
                models, or they are more than a batch holds.
        """
        if not jobs:
            return
        names = {job.model for job in jobs}
        if len(names) > 1:
            raise GptzooError(f"jobs submitted together run on one model; these name {', '.join(sorted(names))}")
        name = names.pop()
        if name not in self._lanes and len(self._lanes) > 1:
            raise GptzooError(f"no model {name!r} is served; models: {', '.join(self._lanes)}")
        lane = self._lanes[name] if name in self._lanes else next(iter(self._lanes.values()))
        if lane.max_batch is not None and len(jobs) > lane.max_batch:
            raise GptzooError(f"{len(jobs)} sequences submitted together, but a batch holds at most {lane.max_batch}")
        with self._wake:
            if self._stopping:
                raise GptzooError("the server is shutting down")
            self._pending.append(_Admission(list(jobs), lane))
            self._wake.notify()

    def run(self) -> None:
        """Run every submitted job to its end in this thread (what ``generate`` does)."""
        while self._pending or self._busy():
            self._cycle()

    def start(self) -> None:
        """Run in a thread of the engine's, taking jobs as they are submitted, until :meth:`stop`."""
        self._thread.start()

    def abort(self, failure: str) -> None:
        """Cancel every queued and running job, each ending ``"error"`` with ``failure``."""
        with self._wake:
            jobs = [job for admission in self._pending for job in admission.jobs]
        for lane in list(self._lanes.values()):
            jobs += [seq.job for seq in lane.rows] + [seq.job for batch in list(lane.parked) for seq in batch.seqs]
        for job in jobs:
            job.cancel(failure)
        with self._wake:
            self._wake.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued and running job, then end the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the loop -----------------------------------------------------------------------------

    def _busy(self) -> list[_Lane]:
        return [lane for lane in self._lanes.values() if lane.running]

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not (self._pending or self._busy() or self._stopping):
                    self._wake.wait()
                if self._stopping and not (self._pending or self._busy()):
                    return
            self._cycle()

    def _cycle(self) -> None:
        """Admit what fits, then give every batch with running rows its turn."""
        self._admit()
        busy = self._busy()
        for lane in busy:
            try:
                self._decode(lane, None if len(busy) == 1 else TURN_STEPS)
            except Exception as exc:  # a broken step fails its batch's jobs, never the engine
                self._fail(lane, exc)

    def _fail(self, lane: _Lane, exc: Exception) -> None:
        for seq in lane.rows:
            if not seq.ended:
                self._finish(seq.job, Finished("error", describe_exception(exc), exc))
        self._clear(lane)

    def _clear(self, lane: _Lane) -> None:
        """The lane's batch has ended: its memory goes, and a parked batch takes its place."""
        lane.rows, lane.draws, lane.cache, lane.step, lane.stale = [], [], None, None, False
        if lane.parked:
            self._take(lane, lane.parked.popleft())

    def _fits(self, admission: _Admission, taken: int) -> bool:
        """The admission's batch has room for it beside ``taken`` rows admitted in this round."""
        lane = admission.lane
        if lane.parked:
            return False
        if lane.unbatched or lane.max_batch is None:  # one admission at a time, into an empty batch
            return not taken and not drawing(lane.draws)
        return lane.occupied + taken + len(admission.jobs) <= lane.max_batch

    def _room(self) -> bool:
        """A queued admission whose batch has room."""
        return any(self._fits(a, 0) for a in self._pending)

    def _admit(self) -> None:
        """Prefill the queued admissions whose batches have room, those of one model as one batch."""
        with self._wake:
            taken: dict[_Lane, list[_Admission]] = {}
            for admission in list(self._pending):
                lane = admission.lane
                if self._fits(admission, sum(len(a.jobs) for a in taken.get(lane, []))):
                    taken.setdefault(lane, []).append(admission)
                    self._pending.remove(admission)
            self._admitted += sum(len(a.jobs) for admissions in taken.values() for a in admissions)
        for lane, admissions in taken.items():
            try:
                self._prefill(lane, admissions)
            except Exception as exc:  # these prompts' failure fails these jobs only
                for admission in admissions:
                    for job in admission.jobs:
                        self._finish(job, Finished("error", describe_exception(exc), exc))

    @torch.no_grad()
    def _prefill(self, lane: _Lane, admissions: list[_Admission]) -> None:
        """One forward of the admissions' prompts, left-padded; their first tokens drawn."""
        kept = []
        for admission in admissions:
            jobs = [job for job in admission.jobs if not job.cancelled.is_set()]
            for job in admission.jobs:
                if job.cancelled.is_set():
                    self._finish(job, job.cancelled_event())
            if jobs:
                kept.append(jobs)
        if not kept:
            return
        jobs = [job for group in kept for job in group]
        model = lane.model
        device = model.wte.weight.device
        longest = max(len(job.prompt) for job in jobs)
        tokens, real = left_padded([job.prompt for job in jobs], device)
        mask = None if real is None else real.long()
        # Rows that can move need room for their own tokens only (a full cache is gathered anew, without the
        # rows that ended, as they end first); rows that cannot need room for the longest budget after the
        # longest prompt.
        ends = [len(job.prompt) + job.max_tokens for job in jobs]
        movable = lane.unbatched is None and lane.max_batch is not None
        cache = model.init_cache(len(jobs), max(ends) if movable else longest + max(job.max_tokens for job in jobs))
        scored = any(job.prompt_logprobs for job in jobs)
        logits = model(tokens, cache, attention_mask=mask, logits_to_keep=None if scored else 1)
        seqs = [_Sequence(job, len(job.prompt)) for job in jobs]
        for i, seq in enumerate(seqs):
            job = seq.job
            if job.prompt_logprobs:
                ids = torch.tensor(job.prompt[1:], device=device)
                scores = self._scores(logits[i, longest - len(job.prompt) : -1], ids, job.logprobs or 0)
                job.deliver(PromptScores((Token(job.prompt[0]), *scores)))
            if job.max_tokens == 0:  # only the prompt's scores were asked for
                self._finish(seq.job, Finished("length"))
        draws, at = [], 0
        for group in kept:
            shared: dict[tuple[int, int], list[_Sequence]] = {}
            for seq in seqs[at : at + len(group)]:
                shared.setdefault((id(seq.job.sampler), id(seq.job.generator)), []).append(seq)
            at += len(group)
            draws += [_Draw(rows, rows[0].job.sampler, rows[0].job.generator, device) for rows in shared.values()]
        last = logits[:, -1]
        for draw in draws:
            draw.place(seqs)
            self._draw(draw, draw.logits(last))
        self._join(lane, _Prefilled(cache, seqs, draws))
        self._after_step(lane)

    def _join(self, lane: _Lane, batch: _Prefilled) -> None:
        """The prefilled rows into the lane's batch: as its batch when it has none, else gathered into it,
        else (their rows cannot move) parked until it empties."""
        if not drawing(lane.draws):
            self._take(lane, batch)
            return
        if not drawing(batch.draws):
            return
        try:
            self._rebuild(lane, batch)
        except PluginError as exc:  # a plugin's mover failed: one admission at a time from now on
            lane.unbatched = f"moving rows failed: {exc}"
            lane.parked.append(batch)

    def _take(self, lane: _Lane, batch: _Prefilled) -> None:
        lane.cache, lane.rows, lane.draws = batch.cache, batch.seqs, batch.draws
        self._plan(lane)

    def _plan(self, lane: _Lane) -> None:
        """The native step of the lane's new batch, and its path reported."""
        cache, model, rows = lane.cache, lane.model, len(lane.rows)
        assert cache is not None
        with native_decoding(model) if rows <= MAX_ROWS else nullcontext() as tuner:
            step, why = compile_step(model, cache, rows, split=True) if tuner is not None else (None, None)
        lane.step, lane.stale = step, False
        if self.on_decode_path is not None:
            self.on_decode_path(decode_path(model, step, why if tuner is not None else why_eager(model, rows)))

    def _rebuild(self, lane: _Lane, joining: _Prefilled | None = None) -> None:
        """One cache for the rows of the lane's running draws (and ``joining``'s), each right-aligned, with
        room for every row's last token; the rows of ended draws dropped.

        Raises:
            PluginError: a plugin's mover failed (the lane's batch is as it was).
        """
        old = lane.cache
        assert old is not None
        if lane.unbatched is not None:
            raise GptzooError(f"the batch's cache is full and its rows cannot be moved: {lane.unbatched}")
        parts = [(old, lane.draws, lane.rows)]
        if joining is not None:
            parts.append((joining.cache, joining.draws, joining.seqs))
        rows, seqs, draws, capacity = [], [], [], 0
        for cache, part_draws, part_rows in parts:
            for draw in part_draws:
                if not draw.running:
                    continue
                need = draw.remaining
                for seq in draw.seqs:
                    rows.append(Row(cache, part_rows.index(seq), seq.cached))
                    seqs.append(seq)
                    capacity = max(capacity, seq.cached + need)
                draws.append(draw)
        if not draws:
            self._clear(lane)
            return
        if len(rows) == 1 and old.key_mask is None and old.length == rows[0].length and rows[0].cache is old:
            cache = old  # a lone sequence keeps its own cache
        else:
            cache = gather(lane.model, rows, capacity, lane.registry)
        for draw in draws:
            draw.place(seqs)
        lane.cache, lane.rows, lane.draws = cache, seqs, draws
        self._plan(lane)

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

    def _finish(self, job: Job, event: Finished) -> None:
        if job.finished:
            return
        job.finished = True
        self._admitted -= 1
        job.deliver(event)

    def _draw(self, draw: _Draw, rows: Tensor) -> None:
        """The next token of each of the draw's rows, from their logits (G, V), handed over."""
        for seq in draw.seqs:
            if not seq.ended and seq.job.cancelled.is_set():
                self._finish(seq.job, seq.job.cancelled_event())
        if not draw.running:
            return
        limit = self.vocab_size if self.vocab_size is not None and self.vocab_size < rows.shape[-1] else None
        try:
            check_finite(rows[:, :limit], draw.steps)
            rows = within_vocab(rows, limit)
            if draw.sampler is None:
                nxt = rows.float().argmax(dim=-1)
            else:
                assert draw.history is not None
                nxt = draw.sampler(rows, draw.history, draw.generator, real=draw.real)
        except Exception as exc:  # these rows' logits or sampler: only their jobs fail
            for seq in draw.seqs:
                if not seq.ended:
                    self._finish(seq.job, Finished("error", describe_exception(exc), exc))
            return
        draw.steps += 1
        if draw.history is not None:
            draw.history = torch.cat([draw.history, nxt[:, None]], dim=1)
            if draw.real is not None:
                draw.real = torch.cat([draw.real, draw.real.new_ones(len(draw.seqs), 1)], dim=1)
        for k, (seq, token) in enumerate(zip(draw.seqs, nxt.tolist(), strict=True)):
            seq.last = token
            if seq.ended:
                continue
            job = seq.job
            seq.generated += 1
            if job.logprobs is not None:
                job.deliver(self._scores(rows[k : k + 1], torch.tensor([token], device=rows.device), job.logprobs)[0])
            else:
                job.deliver(Token(token))
            if token == self.eos:
                self._finish(seq.job, Finished("eos"))
            elif seq.generated >= job.max_tokens:
                self._finish(seq.job, Finished("length"))

    def _after_step(self, lane: _Lane) -> None:
        """Tell the caller a step's tokens are out; end what it cancelled; mark the cache for a rebuild when
        the rows of ended draws outnumber the others."""
        if self.after_step is not None:
            self.after_step()
        for seq in lane.rows:
            if not seq.ended and seq.job.cancelled.is_set():
                self._finish(seq.job, seq.job.cancelled_event())
        running = sum(len(d.seqs) for d in lane.draws if d.running)
        if not running:
            self._clear(lane)
        elif lane.unbatched is None and len(lane.rows) - running > running:
            lane.stale = True

    @torch.no_grad()
    def _decode(self, lane: _Lane, turn: int | None) -> None:
        """Decoding steps for a batch's rows until a queued job has room, its rows must be gathered anew, or
        ``turn`` steps have run."""
        if lane.stale:
            try:
                self._rebuild(lane)
            except PluginError as exc:  # a plugin's mover failed: the batch goes on with its ended rows
                lane.unbatched, lane.stale = f"moving rows failed: {exc}", False
        model, done = lane.model, 0
        device = model.wte.weight.device
        with native_decoding(model) if len(lane.rows) <= MAX_ROWS else nullcontext() as tuner:
            while drawing(lane.draws) and not lane.stale and (turn is None or done < turn):
                with self._wake:
                    if self._room():
                        return
                cache = lane.cache
                assert cache is not None
                if cache.length >= cache.max_len:  # the rows that need room are behind ended ones
                    lane.stale = True
                    return
                tokens = torch.tensor([[seq.last] for seq in lane.rows], device=device)
                begun = time.perf_counter()
                logits = (lane.step(tokens) if lane.step is not None else model(tokens, cache))[:, -1]
                if tuner is not None:
                    tuner.record(time.perf_counter() - begun)
                self.steps += 1
                done += 1
                for seq in lane.rows:
                    seq.cached += 1
                for draw in lane.draws:
                    self._draw(draw, draw.logits(logits))
                self._after_step(lane)

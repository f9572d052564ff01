"""Continuous batching (gptzoo.inference.engine): sequences that join and leave a running batch give the
tokens each gives alone, for every registered attention and position; a cancel frees a row."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tiny import PAIRS, tiny_model

import gptzoo
from gptzoo.errors import GptzooError
from gptzoo.inference.batching import Row, gather, unbatchable
from gptzoo.inference.engine import Engine, Event, Finished, Job, PromptScores, Token
from gptzoo.inference.generate import generate
from gptzoo.interfaces import LayerKVCache

PROMPTS = [[5, 9, 11, 2, 7, 3, 8], [42], [1, 2, 3, 4], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], [3, 1]]
NEW = [12, 9, 14, 5, 11]


class Collect:
    """A job's events; ``after`` runs once the job has ``at`` tokens (to join others mid-decode), and
    ``done`` is released when it finishes."""

    def __init__(
        self, at: int = -1, after: Callable[[], None] | None = None, done: threading.Semaphore | None = None
    ) -> None:
        self.tokens: list[int] = []
        self.events: list[Event] = []
        self.at, self.after, self.done = at, after, done

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Token):
            self.tokens.append(event.id)
            if len(self.tokens) == self.at and self.after is not None:
                self.after()
        if isinstance(event, Finished) and self.done is not None:
            self.done.release()

    @property
    def end(self) -> Finished:
        last = self.events[-1]
        assert isinstance(last, Finished)
        return last


def staggered(
    engine: Engine, prompts: list[list[int]], new: list[int], models: list[str] | None = None
) -> list[Collect]:
    """Run the engine on the prompts (on ``models``, by name), each joining when the one before it has 2
    tokens: rows join and leave a running batch."""
    done = threading.Semaphore(0)
    jobs: list[Job] = []
    sinks = []
    for i, (prompt, n) in enumerate(zip(prompts, new, strict=True)):
        join = (lambda i=i: engine.submit(jobs[i + 1])) if i + 1 < len(prompts) else None
        sinks.append(Collect(2, join, done))
        jobs.append(Job(prompt, n, sinks[-1], model=models[i] if models else ""))
    engine.start()
    try:
        engine.submit(jobs[0])
        for _ in jobs:
            assert done.acquire(timeout=120)
    finally:
        engine.stop()
    return sinks


def caches_of(model: gptzoo.GPT, cls: type) -> None:
    """Make every attention of ``model`` keep its keys and values in a cache of class ``cls`` (a LayerKVCache's)."""
    for block in model.blocks:
        attn = block.attn
        attn.init_cache = lambda b, n, *, device=None, dtype=None, attn=attn: cls(
            b, attn.n_kv_head, n, attn.head_dim, device=device, dtype=dtype
        )


def alone_each(engine: Engine, jobs: list[Job], sinks: list[Collect]) -> None:
    """Run each job to its end before the next is submitted."""
    for job, sink in zip(jobs, sinks, strict=True):
        sink.done = threading.Semaphore(0)
        engine.submit(job)
        assert sink.done.acquire(timeout=120)


@pytest.mark.parametrize(("base", "attention", "position"), PAIRS)
def test_rows_that_join_and_leave_give_what_they_give_alone(base: str, attention: str, position: str) -> None:
    model = tiny_model(base, f"model.attention={attention}", f"model.position={position}")
    alone = [generate(model, [p], n)[0] for p, n in zip(PROMPTS, NEW, strict=True)]
    engine = Engine(model, eos_token_id=None, context=64, max_batch=4)
    assert engine.unbatched is None and engine.max_batch == 4
    sinks = staggered(engine, PROMPTS, NEW)
    assert [s.tokens for s in sinks] == alone
    assert [s.end.reason for s in sinks] == ["length"] * len(PROMPTS)
    assert engine.steps < sum(NEW)  # rows shared steps


def test_a_cache_class_it_cannot_move_rows_of_runs_one_sequence_at_a_time() -> None:
    class OwnCache(LayerKVCache):
        pass

    model = tiny_model("llama-tiny")
    alone = [generate(model, [p], n)[0] for p, n in zip(PROMPTS, NEW, strict=True)]
    caches_of(model, OwnCache)
    engine = Engine(model, eos_token_id=None, context=64, max_batch=8)
    assert engine.max_batch == 1
    assert "test_engine:test_a_cache_class_it_cannot_move_rows_of_runs_one_sequence_at_a_time.<locals>.OwnCache" in (
        engine.describe()
    )
    sinks = staggered(engine, PROMPTS, NEW)
    assert [s.tokens for s in sinks] == alone


def test_models_by_name_each_keep_their_own_batch() -> None:
    first, second = tiny_model("llama-tiny"), tiny_model("llama-tiny", "model.position=alibi")
    names = ["a", "b", "a", "b", "b"]
    models = {"a": first, "b": second}
    alone = [generate(models[m], [p], n)[0] for m, p, n in zip(names, PROMPTS, NEW, strict=True)]
    engine = Engine(models, eos_token_id=None, context=64, max_batch=4)
    sinks = staggered(engine, PROMPTS, NEW, names)
    assert [s.tokens for s in sinks] == alone
    assert alone[0] != generate(second, [PROMPTS[0]], NEW[0])[0]  # the models differ
    with pytest.raises(GptzooError, match="no model 'c' is served; models: a, b"):
        engine.submit(Job([1], 1, Collect(), model="c"))


def test_gather_right_aligns_rows_and_counts_their_positions() -> None:
    model = tiny_model("llama-tiny")
    short, long = model.init_cache(1, 8), model.init_cache(1, 8)
    model(torch.tensor([[1, 2]]), short)
    model(torch.tensor([[3, 4, 5, 6, 7]]), long)
    cache = gather(model, [Row(short, 0, 2), Row(long, 0, 5)], 9)
    assert cache.length == 5 and cache.max_len == 9
    assert cache.key_mask is not None and cache.next_position is not None
    assert cache.key_mask[:, :5].tolist() == [[False, False, False, True, True], [True] * 5]
    assert cache.next_position.tolist() == [[2], [5]]
    first = cache.layers[0]
    assert torch.equal(first.k[0, :, 3:5], short.layers[0].k[0, :, :2])
    assert torch.equal(first.k[0, :, :3], torch.zeros_like(first.k[0, :, :3]))  # padding: zeros, never NaN
    assert torch.equal(first.v[1, :, :5], long.layers[0].v[0, :, :5])
    assert unbatchable(cache) is None


def test_logprobs_cancel_and_a_prompt_only_job() -> None:
    model = tiny_model("gpt2-tiny")
    engine = Engine(model, eos_token_id=None, context=64, max_batch=4)
    scored, cancelled, prompt_only = Collect(), Collect(), Collect()
    jobs = [
        Job([5, 9, 11, 2], 3, scored, logprobs=2, prompt_logprobs=True),
        Job([1, 2, 3], 40, cancelled),
        Job([4, 5, 6], 0, prompt_only, logprobs=0, prompt_logprobs=True),
    ]
    cancelled.at, cancelled.after = 3, jobs[1].cancel
    engine.start()
    try:
        alone_each(engine, jobs, [scored, cancelled, prompt_only])
    finally:
        engine.stop()
    prompt = scored.events[0]
    assert isinstance(prompt, PromptScores) and [t.id for t in prompt.tokens] == [5, 9, 11, 2]
    logits = model(torch.tensor([[5, 9, 11, 2]])).float().log_softmax(-1)[0]
    assert prompt.tokens[0].logprob is None
    for t, token in enumerate(prompt.tokens[1:]):
        assert token.logprob == pytest.approx(logits[t, token.id].item(), abs=1e-5)
        assert [i for i, _ in token.top] == logits[t].topk(2).indices.tolist()
    new = [e for e in scored.events if isinstance(e, Token)]
    assert new[0].id == int(logits[-1].argmax()) and new[0].logprob == pytest.approx(logits[-1].max().item(), abs=1e-5)
    assert len(new) == 3 and all(len(t.top) == 2 for t in new) and scored.end.reason == "length"
    assert 3 <= len(cancelled.tokens) <= 4 and cancelled.end.reason == "cancelled"
    assert prompt_only.tokens == [] and prompt_only.end.reason == "length"
    assert isinstance(prompt_only.events[0], PromptScores)


ROWS_PLUGIN = """
import gptzoo
from gptzoo.interfaces import LayerKVCache

gptzoo_contract = 6


class TimeMajorCache(LayerKVCache):
    \"\"\"Keys and values kept position-major: (max_len, B, nkv, hs), seen by attention as (B, nkv, T, hs).\"\"\"

    def __init__(self, batch_size, n_kv_head, max_len, head_dim, *, device=None, dtype=None):
        super().__init__(batch_size, n_kv_head, max_len, head_dim, device=device, dtype=dtype)
        self.k = self.k.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
        self.v = self.v.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def move(dst, i, dst_end, src, j, src_end, n):
    dst.k[i, :, dst_end - n : dst_end] = src.k[j, :, src_end - n : src_end]
    dst.v[i, :, dst_end - n : dst_end] = src.v[j, :, src_end - n : src_end]


@gptzoo.hookimpl
def register_cache_rows(register):
    register(TimeMajorCache, move)
"""


def plugin_cached(fake_site: Any, monkeypatch: Any, name: str, source: str) -> tuple[gptzoo.GPT, list[list[int]]]:
    """llama-tiny keeping its keys and values in the TimeMajorCache of the plugin ``source`` (installed as
    ``name``), and the tokens each of PROMPTS gives alone."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add(name, f"gptzoo_fake_{name}", source)
    registry = gptzoo.get_registry()
    own = importlib.import_module(f"gptzoo_fake_{name}").TimeMajorCache
    torch.manual_seed(0)
    model = gptzoo.build_model(gptzoo.load_recipe("llama-tiny", registry=registry), registry=registry).eval()
    alone = [generate(model, [p], n)[0] for p, n in zip(PROMPTS, NEW, strict=True)]
    caches_of(model, own)
    return model, alone


def test_a_plugin_cache_class_batches_through_register_cache_rows(fake_site: Any, monkeypatch: Any) -> None:
    model, alone = plugin_cached(fake_site, monkeypatch, "timemajor", ROWS_PLUGIN)
    engine = Engine(model, eos_token_id=None, context=64, max_batch=4)
    assert engine.unbatched is None and engine.max_batch == 4
    sinks = staggered(engine, PROMPTS, NEW)
    assert [s.tokens for s in sinks] == alone
    assert engine.steps < sum(NEW)  # the rows shared steps


FAILING_ROWS_PLUGIN = ROWS_PLUGIN.replace(
    "def move(dst, i, dst_end, src, j, src_end, n):\n",
    "def move(dst, i, dst_end, src, j, src_end, n):\n    raise RuntimeError('this mover is broken')\n",
)


def test_a_mover_that_raises_falls_back_to_one_admission_at_a_time(fake_site: Any, monkeypatch: Any) -> None:
    """A plugin's mover that fails leaves every request to finish (rows then run one admission at a time),
    where it used to fail every sequence of the batch."""
    model, alone = plugin_cached(fake_site, monkeypatch, "brokenmover", FAILING_ROWS_PLUGIN)
    engine = Engine(model, eos_token_id=None, context=64, max_batch=4)
    assert engine.unbatched is None  # the mover is registered: it fails only when rows move
    sinks = staggered(engine, PROMPTS, NEW)
    assert [s.end.reason for s in sinks] == ["length"] * len(PROMPTS)
    assert [s.tokens for s in sinks] == alone
    assert engine.unbatched is not None and "this mover is broken" in engine.unbatched


def test_generate_is_one_admission_of_the_engine() -> None:
    """generate() runs the engine: a batch of prompts is one prefill and shares every step."""
    model = tiny_model("llama-tiny")
    steps: list[int] = []
    original = Engine.run

    def run(self: Engine) -> None:
        original(self)
        steps.append(self.steps)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "run", run)
        out = generate(model, PROMPTS, 9)
    assert steps == [8] and [len(t) for t in out] == [9] * len(PROMPTS)  # the first token comes from the prefill


@pytest.mark.parametrize("reference", ["gptzoo_fake_bynameA:move", "gptzoo_fake_bynameA:nothing_here"])
def test_a_mover_registered_by_reference_batches_or_falls_back_naming_it(
    fake_site: Any, monkeypatch: Any, reference: str
) -> None:
    """``register(Cache, "module:function")`` names the mover as every other hook may (imported when rows first
    move); one that cannot be imported leaves rows to run one admission at a time, the reason naming it."""
    source = ROWS_PLUGIN.replace("register(TimeMajorCache, move)", f"register(TimeMajorCache, {reference!r})")
    model, alone = plugin_cached(fake_site, monkeypatch, "bynameA", source)
    engine = Engine(model, eos_token_id=None, context=64, max_batch=4)
    sinks = staggered(engine, PROMPTS, NEW)
    assert [s.tokens for s in sinks] == alone
    if reference.endswith(":move"):
        assert engine.unbatched is None and engine.steps < sum(NEW)
    else:
        assert (
            engine.unbatched is not None
            and (
                f"the mover of gptzoo_fake_bynameA:TimeMajorCache registered by gptzoo_fake_bynameA "
                f"(gptzoo-fake-bynameA 1.0) as {reference!r} cannot be imported"
            )
            in engine.unbatched
        )


def test_the_engine_describes_itself_in_one_plain_line() -> None:
    engine = Engine(tiny_model("llama-tiny"), eos_token_id=None, context=64, max_batch=4)
    assert engine.describe().startswith("continuous batching of up to 4 sequences (KV cache at most ")

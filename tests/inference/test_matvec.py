"""Few-row CPU decoding through the native kernels: same numbers as torch, threads that do not
change them, everything restored afterwards, and int8 weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_model  # tests/ is on sys.path (pyproject: pythonpath)
from torch import nn

from gptzoo.inference import matvec
from gptzoo.inference.generate import generate
from gptzoo.inference.matvec import MAX_ROWS, ThreadTuner, native_decoding, native_linear
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.inference.quantize import Int8Linear, quantize

pytestmark = pytest.mark.skipif(library() is None, reason=f"native kernels unavailable: {unavailable_reason()}")

# sizes that exercise every tail: below one vector, odd, and above the 64-row chunks
SHAPES = [(1, 1), (3, 5), (7, 33), (130, 67), (200, 640)]


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
def test_float32_products_equal_torch_to_rounding(out_features: int, in_features: int, rows: int) -> None:
    g = torch.Generator().manual_seed(out_features * 1000 + in_features)
    w, b = torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)
    x = torch.randn(2, rows, in_features, generator=g)[:1]  # a view: the kernels take a copy if need be
    with torch.no_grad():
        got = native_linear(x, w, b, None)
    assert got is not None and got.shape == (1, rows, out_features) and got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * in_features**0.5)


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_bfloat16_products_are_float32_sums_rounded_once(out_features: int, in_features: int) -> None:
    g = torch.Generator().manual_seed(in_features)
    w = torch.randn(out_features, in_features, generator=g).bfloat16()
    b = torch.randn(out_features, generator=g).bfloat16()
    x = torch.randn(2, in_features, generator=g).bfloat16()
    with torch.no_grad():
        got = native_linear(x, w, b, None)
    exact = (x.double() @ w.double().T + b.double()).float()
    assert got is not None and got.dtype == torch.bfloat16
    # one rounding to bfloat16 of a float32 sum: at most one bfloat16 step from the exact value
    step = exact.abs().clamp_min(1e-30) * 2**-7
    assert ((got.float() - exact).abs() <= step + 1e-6 * in_features).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out_features", "rows"), [(1000, 4), (200, 1), (37, 3)])
def test_threads_do_not_change_a_single_bit(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, out_features: int, rows: int
) -> None:
    """The rows of W per chunk follow the thread count (a few hundred rows still split evenly); the
    numbers do not."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(out_features, 300, generator=g).to(dtype), torch.randn(rows, 300, generator=g).to(dtype)
    results = []
    for threads in (1, 2, 3, 5):
        monkeypatch.setattr(matvec, "_tuner", ThreadTuner(threads))  # current: threads
        with torch.no_grad():
            results.append(native_linear(x, w, None, None))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_what_the_kernels_do_not_take_is_refused() -> None:
    w, x = torch.randn(4, 3), torch.randn(1, 3)
    with torch.no_grad():
        assert native_linear(torch.randn(MAX_ROWS + 1, 3), w, None, None) is None  # a prefill: torch's
        assert native_linear(x.double(), w.double(), None, None) is None
        assert native_linear(x.bfloat16(), w, None, None) is None  # weights of another dtype
        assert native_linear(x, w, torch.randn(4).bfloat16(), None) is None
        assert native_linear(x, torch.randn(3, 4).T, None, None) is None  # not contiguous
    assert native_linear(x, w, None, None) is None  # gradients enabled


@pytest.mark.parametrize("base", ["gpt2-tiny", "llama-tiny"])
def test_one_token_logits_match_torch_and_layers_are_restored(base: str) -> None:
    model = tiny_model(base)
    threads = torch.get_num_threads()
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        expected = model(idx[:, -1:])
        full = model(idx[:, :1].expand(MAX_ROWS + 1, 1))
        with native_decoding(model) as tuner:
            assert tuner is not None and tuner.current == threads
            assert torch.get_num_threads() == 1
            assert all("forward" in vars(m) for m in linears)
            got = model(idx[:, -1:])
            several = model(idx[:, :1].expand(MAX_ROWS + 1, 1))  # more rows than the kernels take
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(several, full, rtol=0, atol=1e-5)  # one thread instead of several: last bits only
    assert torch.get_num_threads() == threads
    assert not any("forward" in vars(m) for m in linears)


def test_restored_when_the_block_raises() -> None:
    model = tiny_model("gpt2-tiny")
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"), native_decoding(model):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == threads and matvec._tuner is None
    assert not any("forward" in vars(m) for m in model.modules())


def test_linear_subclasses_and_other_dtypes_are_left_alone() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    net = nn.Sequential(Scaled(4, 3), nn.Linear(3, 2), nn.Linear(2, 2).double())
    x = torch.randn(1, 4)
    with torch.no_grad():
        expected = net[1](net[0](x))
        with native_decoding(net) as tuner:
            assert tuner is not None
            assert [("forward" in vars(m)) for m in net] == [False, True, False]
            torch.testing.assert_close(net[1](net[0](x)), expected, rtol=0, atol=1e-6)


def test_inputs_that_need_grad_take_the_layers_own_forward() -> None:
    net = nn.Linear(4, 3)
    x = torch.randn(1, 4, requires_grad=True)
    with native_decoding(net):
        net(x).sum().backward()
    assert x.grad is not None and net.weight.grad is not None


def test_tuner_settles_on_the_faster_thread_count_and_keeps_checking() -> None:
    tuner = ThreadTuner(2)
    chosen = []
    for _ in range(3 * ThreadTuner.EXPLORE_EVERY):
        chosen.append(tuner.current)
        tuner.record(0.010 if tuner.current == 1 else 0.030)  # two threads are slower: the cores are shared
    tail = chosen[ThreadTuner.EXPLORE_EVERY :]
    assert tail.count(1) > 0.9 * len(tail) and 2 in tail  # mostly one thread, the other still tried
    assert ThreadTuner(1).choices == [1]


def test_tuner_tries_less_often_while_trials_lose_and_follows_a_change_at_once() -> None:
    """On a quiet machine a trial of one thread costs a step at half speed: each losing trial doubles
    the wait (64 steps at first, up to 512). When two threads slow down (another process took a core),
    the tuner moves to one thread without waiting for a trial, and the waits start over."""
    tuner = ThreadTuner(2)
    cost = {2: 0.010, 1: 0.020}
    trials = []
    for step in range(1600):
        if tuner.current == 1:
            trials.append(step)
        tuner.record(cost[tuner.current])
    assert trials[0] == 1  # the first trial at once: both counts measured
    assert [b - a for a, b in zip(trials, trials[1:], strict=False)] == [128, 256, 512, 512]
    cost[2] = 0.060  # a competing process: two threads now wait for each other
    chosen = []
    for _ in range(200):
        chosen.append(tuner.current)
        tuner.record(cost[tuner.current])
    assert chosen[:3] == [2, 2, 1] or chosen[:2] == [2, 1]  # moved once the smoothed time passed one thread's
    assert chosen[3:].count(1) > 0.9 * len(chosen[3:]) and 2 in chosen[3:]  # still trying two threads


def test_int8_rows_round_to_the_nearest_of_127_steps() -> None:
    g = torch.Generator().manual_seed(1)
    linear = nn.Linear(70, 130, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(130, 70, generator=g))
        linear.weight[5] = 0  # an all-zero row stays zero
    q = Int8Linear.from_linear(linear)
    w = linear.weight.detach()
    assert q.qweight.dtype == torch.int8 and q.qweight.abs().max() == 127
    dequantized = q.qweight.float() * q.scale[:, None]
    assert (dequantized - w).abs().max() <= q.scale.max() / 2 + 1e-7
    assert torch.equal(q.qweight[5], torch.zeros(70, dtype=torch.int8))
    x = torch.randn(3, 70, generator=g)
    with torch.no_grad():
        few, many = q(x), q(x.repeat(MAX_ROWS, 1))[:3]  # kernels, then dequantized slices
    reference = F.linear(x, dequantized, linear.bias)
    torch.testing.assert_close(few, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(many, reference, rtol=1e-5, atol=1e-4)


def test_int8_model_generates_what_its_dequantized_twin_does() -> None:
    model = tiny_model("llama-tiny")
    quantized = tiny_model("llama-tiny")
    assert quantize(quantized, "int8") == sum(type(m) is nn.Linear for m in model.modules())
    with torch.no_grad():
        for m, q in zip(model.modules(), quantized.modules(), strict=True):
            if isinstance(q, Int8Linear):  # the float model gets exactly the int8 weights
                m.weight.copy_(q.qweight.float() * q.scale[:, None])
    prompts = [[3, 1, 4, 1, 5]]
    assert generate(quantized, prompts, 12) == generate(model, prompts, 12)


def _product_in_child(queue: object) -> None:  # module level: what multiprocessing runs
    torch.set_num_threads(1)  # torch's own OpenMP threads do not survive a fork either
    matvec._tuner = ThreadTuner(2)
    with torch.no_grad():
        queue.put(native_linear(torch.ones(1, 300), torch.ones(1000, 300), None, None).sum().item())


def test_a_forked_child_starts_its_own_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's kernel threads do not exist in a forked child (DataLoader workers, multiprocessing):
    the child's two-thread products start their own instead of waiting for the parent's."""
    import multiprocessing

    monkeypatch.setattr(matvec, "_tuner", ThreadTuner(3))
    with torch.no_grad():  # the parent's workers now run
        native_linear(torch.ones(1, 300), torch.ones(1000, 300), None, None)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_product_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and queue.get(timeout=5) == 300_000.0


def test_without_a_working_compiler_decoding_keeps_torchs_kernels(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gptzoo.inference import native

    monkeypatch.setattr(native, "_reason", None)  # restored afterwards: this process's kernels did build
    monkeypatch.setenv("GPTZOO_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler --quiet")
    assert native.library.__wrapped__() is None
    assert native._reason is not None and "could not be built with no-such-compiler --quiet" in native._reason
    monkeypatch.setattr(matvec, "library", lambda: None)
    model = tiny_model("gpt2-tiny")
    with torch.no_grad(), native_decoding(model) as tuner:
        assert tuner is None and not any("forward" in vars(m) for m in model.modules())
    assert generate(model, [[1, 2, 3]], 4) == generate(tiny_model("gpt2-tiny"), [[1, 2, 3]], 4)


def test_jobs_of_changing_thread_counts_and_sizes_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """More threads than cores, and jobs that need 1 to 7 of them in turn (a matrix of n 64-row
    chunks takes at most n threads): every product equals the one-thread result, none is lost."""
    g = torch.Generator().manual_seed(2)
    mats = [torch.randn(64 * n - 5, 40, generator=g) for n in range(1, 8)]
    x = torch.randn(2, 40, generator=g)
    with torch.no_grad():
        expected = [native_linear(x, w, None, None) for w in mats]  # outside a block: torch's threads
        tuner = ThreadTuner(8)
        monkeypatch.setattr(matvec, "_tuner", tuner)
        for i in range(400):
            tuner.current = (8, 3, 1, 5)[i % 4]
            w = i % len(mats)
            assert torch.equal(native_linear(x, mats[w], None, None), expected[w])

"""--dtype int4: llama.cpp's Q4_1 blocks, their scales and minimums searched, the head in int8; the
kernels' products equal the dequantized weights' within what rounding x to int8 per block of 32 moves
them (as llama.cpp's Q8_0 does, where the CPU has AVX512-VNNI; elsewhere in float32), whatever the
threads; a model generates what its dequantized twin does; a linear that does not split into whole
blocks stays in float, and the load says so."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_model
from torch import Tensor, nn

import gptzoo
from gptzoo.inference import matvec
from gptzoo.inference import quantize as quantize_module
from gptzoo.inference.generate import generate
from gptzoo.inference.matvec import MAX_ROWS, ThreadTuner, native_linear
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.inference.quantize import Int4Linear, Int8Linear, QuantizedLinear, quantize

native = pytest.mark.skipif(library() is None, reason=f"native kernels unavailable: {unavailable_reason()}")


def _linear(out_features: int, in_features: int, seed: int, bias: bool = True) -> nn.Linear:
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=g))
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=g))
    return linear


def test_blocks_are_llama_cpps_q4_1_layout() -> None:
    """Codes, scales and minimums in Q4_1's order: gguf-py dequantizes the blocks, written as a Q4_1
    GGUF tensor holds them (d, m, 16 bytes of codes), to the module's weight, bit for bit."""
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    q = Int4Linear.from_linear(_linear(40, 96, seed=1, bias=False))
    scales = q.scale.view(40, 2, 3).permute(0, 2, 1).contiguous().view(torch.uint8).view(40, 3, 4)
    blocks = torch.cat([scales, q.qweight.view(40, 3, 16)], dim=2).reshape(40, 60).numpy()
    dequantized = quants.dequantize(blocks, GGMLQuantizationType.Q4_1)
    assert np.array_equal(dequantized, q.weight.numpy())
    assert q.codes().min() == 0 and q.codes().max() == 15


def test_weights_on_a_q4_1_grid_come_back_exactly() -> None:
    """Weights that are q * d + m of float16 d and m (a model that was itself a Q4_1 GGUF, as
    SmolLM2-135M's weights here are) quantize to themselves; a block of equal weights too. Blocks whose
    codes span 14 (the low or the high end unused, as a K-quant's may) come back within a float16
    rounding of their minimum (their grid starts at the smallest weight, which float16 may not hold)."""
    g = torch.Generator().manual_seed(5)
    d = (torch.rand(24, 4, 1, generator=g) * 0.1).half().float()
    m = -torch.rand(24, 4, 1, generator=g).half().float()
    codes = torch.randint(0, 16, (24, 4, 32), generator=g).float()
    codes[..., 0], codes[..., 1] = 0, 15
    codes[:8], codes[8:16] = codes[:8].clamp(min=1), codes[8:16].clamp(max=14)
    w = (codes * d + m).reshape(24, 128)
    w[16, :32] = 0.75
    linear = nn.Linear(128, 24, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    got = Int4Linear.from_linear(linear).weight
    assert torch.equal(got[16:], w[16:])
    assert ((got[:16] - w[:16]).abs() <= (m[:16].abs() + d[:16]).repeat_interleave(32, 1).view(16, 128) * 2**-11).all()


def test_the_search_never_does_worse_than_minimum_to_maximum() -> None:
    """Per block, the squared error is at most that of llama.cpp's Q4_1 reference rounding (d = (max -
    min) / 15, m = min), and clearly less over a Gaussian weight; each weight lies within its block's
    span."""
    linear = _linear(64, 256, seed=6, bias=False)
    w = linear.weight.detach()
    blocks = w.view(64, 8, 32)
    lo, hi = blocks.amin(2, keepdim=True), blocks.amax(2, keepdim=True)
    d, m = ((hi - lo) / 15).half().float(), lo.half().float()
    reference = (torch.round((blocks - m) / d).clamp(0, 15) * d + m).view(64, 256)
    got = Int4Linear.from_linear(linear).weight
    error = (got - w).square().view(64, 8, 32).sum(2)
    reference_error = (reference - w).square().view(64, 8, 32).sum(2)
    assert (error <= reference_error * (1 + 1e-6)).all()
    assert error.sum() < 0.85 * reference_error.sum()
    assert ((got - w).abs() <= (hi - lo).repeat_interleave(32, dim=2).view(64, 256) / 15).all()


def _reference(w: Tensor) -> tuple[Tensor, Tensor]:
    """quantize.q4_blocks_reference's codes packed as Int4Linear holds them."""
    codes, scale = quantize_module.q4_blocks_reference(w)
    return (codes[..., :16] | (codes[..., 16:] << 4)).reshape(w.shape[0], -1), scale


def _weights(name: str) -> Tensor:
    g = torch.Generator().manual_seed(len(name))
    shapes = {"few": (3, 96), "tail": (7, 160)}  # 9 and 35 blocks: groups of 8 blocks with a partial last one
    w = torch.randn(*shapes.get(name, (48, 256)), generator=g)
    scaled = {
        "gaussian": 1.0,
        "tiny": 1e-7,  # scales below float16's normals, and zero
        "subnormal": 1e-5,  # scales among float16's subnormals
        "large": 2e4,  # minimums near float16's largest
        "magnitudes": torch.logspace(-9, 3, w.numel()).view(w.shape)[torch.randperm(w.shape[0], generator=g)],
    }
    if name in ("equal", "zeros"):
        return torch.full_like(w, 0.37 if name == "equal" else 0.0)
    if name == "uniform":  # sums of equal signs, whose order moves minimums across float16 roundings
        return torch.rand(w.shape, generator=g)
    if name == "grid":  # ties: codes * d + m, so several candidates fit exactly
        return torch.randint(0, 16, w.shape, generator=g).float() * 0.0625 - 0.5
    return (w * scaled.get(name, 1.0)).clamp(-65504, 65504)


@native
@pytest.mark.parametrize(
    "name",
    ["gaussian", "uniform", "tiny", "subnormal", "large", "magnitudes", "equal", "zeros", "grid", "few", "tail"],
)
def test_the_native_search_makes_the_references_blocks_bit_for_bit(name: str) -> None:
    """quantize.c's search against the torch reference, operation for operation: codes, scales and
    minimums identical (so the speed costs no bit), over blocks that reach float16's subnormal scales, its
    largest minimums, exact ties and a last group of fewer than 8 blocks; and on 1 to 3 threads. The
    uniform weights catch a sum taken in another order (about 10 of their 384 blocks differ then)."""
    w = _weights(name)
    want = _reference(w)
    for threads in (1, 2, 3):
        with patch.object(quantize_module, "kernel_threads", return_value=threads):
            codes, scale = quantize_module.q4_blocks(w)
        assert torch.equal(codes, want[0]), name
        assert torch.equal(scale.view(torch.int16), want[1].view(torch.int16)), name


def test_without_a_compiler_the_reference_makes_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _weights("gaussian")
    monkeypatch.setattr(quantize_module, "library", lambda: None)
    codes, scale = quantize_module.q4_blocks(w)
    assert torch.equal(codes, _reference(w)[0]) and torch.equal(scale, _reference(w)[1])


def test_weights_beyond_float16_are_refused_by_name() -> None:
    """A block's minimum is a float16: a weight beyond 65504 would come back infinite. int8 holds it."""
    model = tiny_model("llama-tiny", "model.d_ff=192")
    with torch.no_grad():
        model.blocks[0].mlp.c_proj.weight[0, 0] = 7e4
    with pytest.raises(gptzoo.GptzooError) as caught:
        quantize(model, "int4")
    assert str(caught.value) == (
        "the weights of blocks.0.mlp.c_proj reach 70000, beyond the 65504 that int4's float16 block scales hold; "
        "load it with --dtype int8 or a float dtype"
    )
    assert not any(isinstance(m, QuantizedLinear) for m in model.modules())  # nothing replaced
    assert quantize(model, "int8") > 0


def _exact_and_bound(q: Int4Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """The product with the dequantized weight in float64, and how far the kernels may be from it: x
    rounded to int8 per block of 32 moves each x by at most half its block's step (max |x| / 127), and
    float32 sums round."""
    w = q.weight.double()
    exact = x.double() @ w.T + (0 if q.bias is None else q.bias.double())
    steps = x.double().view(x.shape[0], -1, 32).abs().amax(-1) / 127
    moved = (steps / 2).repeat_interleave(32, dim=1) @ w.abs().T
    return exact, moved + 1e-5 * (x.double().abs() @ w.abs().T) + 1e-6


@native
@pytest.mark.parametrize(("out_features", "in_features"), [(1, 32), (37, 64), (130, 96), (200, 640)])
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
def test_products_equal_the_dequantized_weights(out_features: int, in_features: int, rows: int) -> None:
    q = Int4Linear.from_linear(_linear(out_features, in_features, seed=in_features))
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        got = native_linear(x, q.qweight, q.bias, q.scale)
        many = q(x.repeat(MAX_ROWS + 1, 1))[:rows]  # more rows than the kernels take: dequantized slices
    exact, bound = _exact_and_bound(q, x)
    assert got is not None and got.shape == (rows, out_features)
    assert ((got.double() - exact).abs() <= bound).all()
    torch.testing.assert_close(many, exact.float(), rtol=1e-5, atol=1e-5 * in_features**0.5)  # torch's, float32


@native
def test_bfloat16_activations_round_once() -> None:
    q = Int4Linear.from_linear(_linear(130, 96, seed=2).bfloat16())
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.no_grad():
        got = native_linear(x, q.qweight, q.bias, q.scale)
    exact, bound = _exact_and_bound(q, x.float())
    assert got is not None and got.dtype == torch.bfloat16
    assert ((got.double() - exact).abs() <= (exact.abs() + bound) * 2**-8 + bound).all()  # rounded once


@native
@pytest.mark.parametrize(("out_features", "rows"), [(1000, 4), (200, 1), (37, 3)])
def test_threads_do_not_change_a_single_bit(monkeypatch: pytest.MonkeyPatch, out_features: int, rows: int) -> None:
    q = Int4Linear.from_linear(_linear(out_features, 320, seed=0, bias=False))
    x = torch.randn(rows, 320, generator=torch.Generator().manual_seed(1))
    results = []
    for threads in (1, 2, 3, 5):
        monkeypatch.setattr(matvec, "_tuner", ThreadTuner(threads))
        with torch.no_grad():
            results.append(native_linear(x, q.qweight, None, q.scale))
    assert all(torch.equal(results[0], r) for r in results[1:])


@native
def test_what_the_kernels_do_not_take_is_refused() -> None:
    q = Int4Linear.from_linear(_linear(8, 64, seed=0))
    with torch.no_grad():
        assert native_linear(torch.randn(1, 64), q.qweight, q.bias, q.scale.float()) is None  # scales not float16
        assert native_linear(torch.randn(1, 64), q.qweight, q.bias, q.scale[:, 0].contiguous()) is None  # no minimums
        assert native_linear(torch.randn(1, 96), q.qweight, q.bias, q.scale) is None  # width not 2 per byte
        assert native_linear(torch.randn(1, 48), torch.zeros(8, 24, dtype=torch.uint8), None, q.scale) is None


def test_a_model_generates_what_its_dequantized_twin_does() -> None:
    model, quantized = tiny_model("llama-tiny", "model.d_ff=192"), tiny_model("llama-tiny", "model.d_ff=192")
    assert quantize(quantized, "int4") == sum(type(m) is nn.Linear for m in model.modules())
    assert type(quantized.lm_head) is Int8Linear and type(quantized.blocks[0].mlp.c_proj) is Int4Linear
    with torch.no_grad():
        for m, q in zip(model.modules(), quantized.modules(), strict=True):
            if isinstance(q, QuantizedLinear):
                m.weight.copy_(q.weight)
    prompts = [[3, 1, 4, 1, 5]]
    assert generate(quantized, prompts, 12) == generate(model, prompts, 12)


def test_linears_without_whole_blocks_stay_in_float_and_the_load_says_so() -> None:
    """Width 48: the attention and MLP inputs (48) are not whole blocks of 32; the MLP's down
    projection (input 192) is, and the head (input 48) is held in int8, which takes any width."""
    loaded = gptzoo.load_model("gpt2-tiny", overrides=["model.n_embd=48", "model.d_ff=192"], dtype="int4", seed=0)
    kinds = {path: type(m).__name__ for path, m in loaded.model.named_modules() if hasattr(m, "in_features")}
    assert kinds["blocks.0.mlp.c_proj"] == "Int4Linear" and kinds["blocks.0.attn.c_attn"] == "Linear"
    assert kinds["lm_head"] == "Int8Linear"
    assert loaded.precision == "int4"
    assert any(
        w.startswith("int4: ") and "kept in float, their inputs not whole blocks of 32: blocks.0.attn.c_attn" in w
        for w in loaded.warnings
    ), loaded.warnings
    x = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        assert torch.isfinite(loaded.model(x)).all()


def test_the_fallback_product_is_f_linear_of_the_dequantized_weight() -> None:
    q = Int4Linear.from_linear(_linear(70, 64, seed=4))
    x = torch.randn(2, 64, requires_grad=True)  # gradients wanted: never the kernels
    torch.testing.assert_close(q(x), F.linear(x, q.weight, q.bias))

"""Multi-head latent attention (plugins/_mla.py) decodes through the native plan: its lowering
(gptzoo.inference.lowerings.lower_latent_attention) computes the absorbed step that LatentAttention's
eager forward computes, for DeepSeek-shaped tiny models (with and without a query bottleneck, rotary
features interleaved or not, left-padded rows), in float32 and bfloat16, in a strict plan; what it does
not describe, it refuses with the reason, and the split plan runs that attention eagerly."""

from __future__ import annotations

import pytest
import torch
from test_decode_plan import assert_close, decode_both, prompts
from tiny import tiny_model

import gptzoo
from gptzoo.inference import matvec
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.inference.quantize import quantize
from gptzoo_plugins._mla import LatentAttention

pytestmark = pytest.mark.skipif(library() is None, reason=f"native kernels unavailable: {unavailable_reason()}")

TINY = (
    "model.n_layer=2",
    "model.n_embd=64",
    "model.n_head=4",
    "model.head_dim=8",
    "model.vocab_size=256",
    "model.d_ff=96",
    "model.context_length=128",
    "model.layer_pattern=['dense', 'moe']",
    "model.mlp=gated",
    "model.attention.kv_rank=16",
    "model.attention.nope_dim=8",
    "model.attention.v_dim=12",
)
"""DeepSeek's recipes at test size: 4 heads of 8 + 8 query and key features and 12 value features, a latent
of 16, YaRN positions; both layers dense (the mixture of experts is another component's lowering)."""

SHAPES = {
    "v2-lite": ("deepseek-v2-lite",),  # q from x, rotary features interleaved, DeepSeek-V2-Lite's scale
    "v3": ("deepseek-v3", "model.attention.q_rank=24"),  # q_a -> q_norm -> q_b
    "v2-lite-halves": ("deepseek-v2-lite", "model.attention.rope_interleave=false"),
    "v3-halves": ("deepseek-v3", "model.attention.q_rank=24", "model.attention.rope_interleave=false"),
}


def deepseek(shape: str, *overrides: str, dtype: torch.dtype = torch.float32) -> gptzoo.GPT:
    base, *rest = SHAPES[shape]
    return tiny_model(base, *TINY, *rest, *overrides).to(dtype)


def padded(model: gptzoo.GPT) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows, the first left-padded by 3 tokens."""
    batch = prompts(model, batch=2, length=7)
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    return batch, mask


@pytest.mark.parametrize("shape", SHAPES)
def test_the_latent_attention_decodes_in_a_strict_plan_as_its_eager_forward_in_float32(shape: str) -> None:
    model = deepseek(shape)
    eager, planned = decode_both(model, prompts(model), steps=12)  # strict: compile_step(..., split=False)
    assert_close(planned, eager)


@pytest.mark.parametrize("shape", ["v2-lite", "v3-halves"])
def test_left_padded_rows_never_attend_to_the_padding(shape: str) -> None:
    model = deepseek(shape)
    batch, mask = padded(model)
    eager, planned = decode_both(model, batch, steps=10, mask=mask, threads=2)
    assert_close(planned, eager)


@pytest.mark.parametrize(("shape", "pad"), [("v2-lite", False), ("v3", False), ("v3", True)])
def test_the_plan_rounds_as_the_eager_absorbed_step_in_bfloat16(shape: str, pad: bool) -> None:
    model = deepseek(shape, dtype=torch.bfloat16)
    batch, mask = padded(model) if pad else (prompts(model), None)
    eager, planned = decode_both(model, batch, steps=12, mask=mask)
    diff = (planned.float() - eager.float()).abs().max().item()
    assert diff <= 0.02 * eager.float().abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


def test_the_step_writes_the_latents_and_rotated_keys_the_eager_step_writes() -> None:
    """The cache after native steps holds what the eager forward's holds, at every position, both rows."""
    model = deepseek("v3")
    batch, mask = padded(model)
    caches = model.init_cache(2, 32), model.init_cache(2, 32)
    with torch.no_grad(), matvec.native_decoding(model):
        for cache in caches:
            model(batch, cache, attention_mask=mask)
        step, why = compile_step(model, caches[1], 2)
        assert step is not None, why
        token = batch[:, -1:]
        for _ in range(6):
            step(token)
            token = model(token, caches[0])[:, -1].argmax(-1, keepdim=True)
    end = batch.shape[1] + 6
    for eager, planned in zip(caches[0].layers, caches[1].layers, strict=True):
        assert (planned.latent[:, :end] - eager.latent[:, :end]).abs().max().item() <= 1e-5
        assert (planned.k_rope[:, :, :end] - eager.k_rope[:, :, :end]).abs().max().item() <= 1e-5


def test_rows_and_threads_do_not_change_a_bit() -> None:
    model = deepseek("v3")
    batch, mask = padded(model)
    _, one = decode_both(model, batch, steps=6, mask=mask, threads=1)
    _, three = decode_both(model, batch, steps=6, mask=mask, threads=3)
    assert torch.equal(one, three)


class Rescaled(LatentAttention):
    """Changes what the absorbed step computes: the lowering no longer describes it."""

    def absorbed(self, *args: torch.Tensor) -> torch.Tensor:
        return 2 * super().absorbed(*args)


def test_a_subclass_that_changes_the_absorbed_step_runs_its_eager_forward_within_a_split_step() -> None:
    model = deepseek("v2-lite")
    for block in model.blocks:
        block.attn.__class__ = Rescaled
    cache = model.init_cache(1, 16)
    with torch.no_grad(), matvec.native_decoding(model):
        model(prompts(model), cache)
        step, why = compile_step(model, cache, 1)
    assert (
        step is None and why == "Rescaled overrides absorbed of LatentAttention, whose lowering would not describe it"
    )
    eager, planned = decode_both(model, prompts(model), steps=4, eager_parts=[why, why])
    assert_close(planned, eager)


def test_a_latent_attention_with_another_cache_is_refused_with_the_reason() -> None:
    model = deepseek("v2-lite")
    cache = model.init_cache(1, 16)
    for i, layer in enumerate(cache.layers):  # the same tensors, under another class
        cache.layers[i] = type("OtherCache", (), {"latent": layer.latent, "k_rope": layer.k_rope, "max_len": 16})()
    with torch.no_grad(), matvec.native_decoding(model):
        step, why = compile_step(model, cache, 1)
    assert step is None
    assert why == "LatentAttention decodes with a cache of class OtherCache, not LatentKVCache"


def test_a_position_bias_is_refused_by_a_strict_plan_and_runs_the_attention_eagerly_in_a_split_one() -> None:
    model = deepseek("v2-lite", "model.position=alibi")
    cache = model.init_cache(1, 16)
    with torch.no_grad(), matvec.native_decoding(model):
        model(prompts(model), cache)
        step, why = compile_step(model, cache, 1)
    assert step is None and why == "ALiBi biases attention (the plan has no attention bias)"
    eager, planned = decode_both(model, prompts(model), steps=4, eager_parts=[why, why])
    assert_close(planned, eager)


def test_int8_weights_decode_through_the_lowering() -> None:
    """kv_b quantized too: both sides absorb its dequantized weight, the other products read int8."""
    model = deepseek("v3")
    quantize(model, "int8")
    eager, planned = decode_both(model, prompts(model), steps=8)
    assert (planned - eager).abs().max().item() <= 1e-4 * eager.abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))

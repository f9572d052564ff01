"""The analytic FLOPs count against the textbook formulas and against torch's FlopCounterMode on
real forward passes of every shipped recipe's shape (depth scaled down: FLOPs are per layer)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import gptzoo
from gptzoo.flops import forward_flops
from gptzoo.recipe import load_recipe, shipped_recipes

aten = torch.ops.aten


def _sdpa_cpu_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode knows the CUDA SDPA kernels but not the CPU one: the same count, QK^T and
    att @ V over the query heads, full square (as torch counts the fused kernels)."""
    b, h, s_q, d = query  # FlopCounterMode passes shapes
    s_k, d_v = key[2], value[3]
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v


def measured_flops(model: gptzoo.GPT, idx: torch.Tensor) -> int:
    with (
        torch.no_grad(),
        FlopCounterMode(
            display=False, custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops}
        ) as counter,
    ):
        model(idx)
    return counter.get_total_flops()


def test_gpt2_small_matches_the_textbook_formulas() -> None:
    model = gptzoo.build_model("gpt2-small", device="meta")
    T, d, L, V = 1024, 768, 12, 50257
    flops = forward_flops(model, batch=1, seq_len=T)
    assert flops == {
        "attention projections": L * 8 * T * d * d,
        "attention scores": L * 4 * T * T * d,
        "mlp": L * 16 * T * d * d,
        "lm head": 2 * T * V * d,
    }
    assert forward_flops(model, batch=4, seq_len=T) == {k: 4 * v for k, v in flops.items()}


def test_gqa_and_gated_mlp_counts() -> None:
    spec = load_recipe("tinyllama-1.1b").model
    flops = forward_flops(gptzoo.build_model("tinyllama-1.1b", device="meta"), batch=1, seq_len=100)
    d, hs, L = spec.n_embd, spec.head_dim, spec.n_layer
    q_o = 2 * d * spec.n_head * hs  # q and o projections
    k_v = 2 * d * spec.n_kv_head * hs  # k and v projections: 8x fewer heads
    assert flops["attention projections"] == L * 2 * 100 * (q_o + k_v)
    assert flops["mlp"] == L * 2 * 100 * 3 * d * spec.d_ff  # gate, up, down


CASES = [(name, "causal") for name in sorted(shipped_recipes())] + [("gpt2-tiny", "eager"), ("llama-tiny", "eager")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "attention"), CASES)
def test_analytic_flops_agree_with_flop_counter(name: str, attention: str) -> None:
    recipe = load_recipe(name, ["model.n_layer=1", f"model.attention={attention}"])
    model = gptzoo.build_model(recipe, dtype=torch.bfloat16).eval()
    B, T = 2, 48
    idx = torch.randint(0, recipe.model.vocab_size, (B, T))
    analytic = sum(forward_flops(model, B, T).values())
    measured = measured_flops(model, idx)
    assert abs(measured - analytic) <= 0.01 * measured, (measured, analytic)
    assert measured == analytic  # only matmuls are counted on both sides, so they agree exactly

"""Components against their formulas and reference implementations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gptzoo
from gptzoo.errors import GptzooError
from gptzoo.inference.sampling import SamplerChain
from gptzoo_plugins._positions import alibi_slopes


def _factory(registry: gptzoo.Registry, kind: str, name: str):
    return registry.get(kind, name).factory


# --- norms ---------------------------------------------------------------------------------------


def test_layernorm_formula(registry: gptzoo.Registry) -> None:
    ln = _factory(registry, "norm", "layernorm")(32, eps=1e-5)
    nn.init.normal_(ln.weight)
    nn.init.normal_(ln.bias)
    x = torch.randn(3, 5, 32, dtype=torch.float64) * 3 + 1
    ln = ln.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as in the paper and torch
    expected = (x - mean) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias
    torch.testing.assert_close(ln(x), expected, rtol=1e-12, atol=1e-12)


def test_layernorm_without_bias(registry: gptzoo.Registry) -> None:
    ln = _factory(registry, "norm", "layernorm")(8, bias=False)
    assert ln.bias is None and [n for n, _ in ln.named_parameters()] == ["weight"]
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ln(x), F.layer_norm(x, (8,), eps=1e-5))


def test_rmsnorm_formula(registry: gptzoo.Registry) -> None:
    rms = _factory(registry, "norm", "rmsnorm")(32, eps=1e-6).double()
    nn.init.normal_(rms.weight)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * rms.weight
    torch.testing.assert_close(rms(x), expected, rtol=1e-12, atol=1e-12)
    assert [n for n, _ in rms.named_parameters()] == ["weight"]


def test_rmsnorm_matches_hf_llama_rmsnorm_in_bfloat16(registry: gptzoo.Registry) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours = _factory(registry, "norm", "rmsnorm")(64, eps=1e-5)
    ref = LlamaRMSNorm(64, eps=1e-5)
    nn.init.normal_(ours.weight)
    ref.weight.data.copy_(ours.weight)
    x = torch.randn(2, 7, 64).bfloat16()
    ours, ref = ours.bfloat16(), ref.bfloat16()
    assert torch.equal(ours(x), ref(x))


# --- activations -----------------------------------------------------------------------------------


def test_activations(registry: gptzoo.Registry) -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    act = lambda name: _factory(registry, "activation", name)()
    assert torch.equal(act("gelu_tanh")(x), nn.GELU(approximate="tanh")(x))
    # GPT-2's formula (HF NewGELUActivation), written out
    gpt2 = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(act("gelu_tanh")(x), gpt2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(act("gelu")(x), x * 0.5 * (1 + torch.erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-12)
    assert torch.equal(act("relu")(x), x.clamp(min=0))
    torch.testing.assert_close(act("silu")(x), x * torch.sigmoid(x), rtol=1e-12, atol=1e-12)
    assert not torch.equal(act("gelu")(x), act("gelu_tanh")(x))


# --- mlps -----------------------------------------------------------------------------------------


def test_dense_and_gated_mlp_formulas(registry: gptzoo.Registry) -> None:
    x = torch.randn(2, 3, 8)
    dense = _factory(registry, "mlp", "dense")(8, 32, activation=nn.GELU(approximate="tanh"), bias=True)
    expected = F.linear(
        F.gelu(F.linear(x, dense.c_fc.weight, dense.c_fc.bias), approximate="tanh"),
        dense.c_proj.weight,
        dense.c_proj.bias,
    )
    torch.testing.assert_close(dense(x), expected)

    gated = _factory(registry, "mlp", "gated")(8, 24, activation=nn.SiLU(), bias=False)
    W, V = gated.c_fc.weight[:24], gated.c_fc.weight[24:]  # gate rows first, then up
    expected = (F.silu(x @ W.T) * (x @ V.T)) @ gated.c_proj.weight.T  # SwiGLU: (silu(xW) * xV) U
    torch.testing.assert_close(gated(x), expected)
    assert gated.c_fc.bias is None and sum(p.numel() for p in gated.parameters()) == 3 * 8 * 24


# --- positions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_equals_hf_llama_rotary_embedding(registry: gptzoo.Registry, theta: float) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hs, nh, nkv = 16, 4, 2
    config = LlamaConfig(
        hidden_size=hs * nh,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        rope_theta=theta,
        max_position_embeddings=4096,
    )
    hf = LlamaRotaryEmbedding(config=config)
    rope = _factory(registry, "position", "rope")(
        n_embd=hs * nh, n_head=nh, head_dim=hs, context_length=4096, theta=theta
    )
    positions = torch.stack([torch.arange(1000, 1037), torch.arange(7, 44)])  # (B, T): per-row offsets
    q, k = torch.randn(2, nh, 37, hs), torch.randn(2, nkv, 37, hs)
    cos, sin = hf(q, positions)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    q_out, k_out = rope.rotary(positions).apply(q, k)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


def test_rope_preserves_norms_and_depends_on_relative_position(registry: gptzoo.Registry) -> None:
    rope = _factory(registry, "position", "rope")(n_embd=32, n_head=2, head_dim=16, context_length=64)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    scores = []
    for offset in (0, 17):
        qr, _ = rope.rotary(torch.tensor([[5 + offset]])).apply(q, q)
        kr, _ = rope.rotary(torch.tensor([[2 + offset]])).apply(k, k)
        torch.testing.assert_close(qr.norm(), q.norm(), rtol=1e-6, atol=0)
        scores.append((qr * kr).sum())
    torch.testing.assert_close(scores[0], scores[1], rtol=1e-5, atol=1e-5)


def test_alibi_slopes_match_the_paper() -> None:
    # Press et al. (2022): for 8 heads the slopes are 1/2, 1/4, ..., 1/256.
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    # 12 heads (not a power of 2): the 8-head slopes, then every other slope of the 16-head set
    # (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5), as in the reference get_slopes.
    expected_12 = [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    assert alibi_slopes(12) == pytest.approx(expected_12, rel=1e-12)
    assert alibi_slopes(16) == pytest.approx([2.0 ** -(i / 2) for i in range(1, 17)], rel=1e-12)


def test_alibi_bias_is_slope_times_distance(registry: gptzoo.Registry) -> None:
    alibi = _factory(registry, "position", "alibi")(n_embd=64, n_head=8, head_dim=8, context_length=64)
    bias = alibi.attn_bias(torch.arange(3, 6)[None], torch.arange(0, 6)[None])[0]  # queries 3..5, keys 0..5
    assert bias.shape == (8, 3, 6)
    assert bias[0, 2, 5].item() == 0.0  # a token and itself
    assert bias[0, 2, 0].item() == -0.5 * 5  # slope 1/2, distance 5
    assert bias[7, 0, 1].item() == -(2.0**-8) * 2


def test_sinusoidal_formula(registry: gptzoo.Registry) -> None:
    d = 16
    sin = _factory(registry, "position", "sinusoidal")(n_embd=d, n_head=2, head_dim=8, context_length=64)
    pe = sin.embed(torch.arange(50)[None])[0]
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_learned_positions_declare_their_limit(registry: gptzoo.Registry) -> None:
    learned = _factory(registry, "position", "learned")(n_embd=8, n_head=2, head_dim=4, context_length=10)
    assert learned.max_positions == 10
    for name in ("none", "sinusoidal", "rope", "alibi"):
        assert (
            _factory(registry, "position", name)(n_embd=8, n_head=2, head_dim=4, context_length=10).max_positions
            is None
        )


# --- samplers --------------------------------------------------------------------------------------


def _chain(registry: gptzoo.Registry, *steps: tuple[str, dict]) -> SamplerChain:
    return SamplerChain.from_registry(registry, steps)


def test_sampler_transforms(registry: gptzoo.Registry) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    ids = torch.tensor([[0, 3]])
    inf = float("-inf")
    t = _chain(registry, ("temperature", {"temperature": 0.5})).transform(logits, ids)
    assert torch.equal(t, logits * 2)
    k = _chain(registry, ("top_k", {"k": 2})).transform(logits, ids)
    assert torch.equal(k, torch.tensor([[2.0, 1.0, inf, inf, inf]]))
    probs = logits.softmax(-1)[0]  # 0.5745, 0.2114, 0.1282, ...
    p = _chain(registry, ("top_p", {"p": float(probs[0] + probs[1])})).transform(logits, ids)
    assert torch.isinf(p[0, 2:]).all() and torch.isfinite(p[0, :2]).all()  # mass of 2 tokens reaches p
    p = _chain(registry, ("top_p", {"p": float(probs[0] + probs[1]) + 1e-4})).transform(logits, ids)
    assert torch.isinf(p[0, 3:]).all() and torch.isfinite(p[0, :3]).all()
    m = _chain(registry, ("min_p", {"p": 0.3})).transform(logits, ids)  # keeps p_i >= 0.3 * 0.5745
    assert torch.isfinite(m[0, :2]).all() and torch.isinf(m[0, 2:]).all()
    r = _chain(registry, ("repetition_penalty", {"penalty": 2.0})).transform(logits, ids)
    assert torch.equal(r, torch.tensor([[1.0, 1.0, 0.5, -2.0, -3.0]]))  # HF: positive / p, negative * p


@pytest.mark.parametrize(
    ("name", "params", "hf_name", "hf_args"),
    [
        ("temperature", {"temperature": 0.7}, "TemperatureLogitsWarper", (0.7,)),
        ("top_k", {"k": 50}, "TopKLogitsWarper", (50,)),
        ("top_k", {"k": 1}, "TopKLogitsWarper", (1,)),
        ("top_p", {"p": 1.0}, "TopPLogitsWarper", (1.0,)),
        ("top_p", {"p": 0.999}, "TopPLogitsWarper", (0.999,)),
        ("top_p", {"p": 0.9}, "TopPLogitsWarper", (0.9,)),
        ("top_p", {"p": 0.5}, "TopPLogitsWarper", (0.5,)),
        ("top_p", {"p": 0.01}, "TopPLogitsWarper", (0.01,)),
        ("min_p", {"p": 0.05}, "MinPLogitsWarper", (0.05,)),
        ("min_p", {"p": 0.5}, "MinPLogitsWarper", (0.5,)),
        ("repetition_penalty", {"penalty": 1.3}, "RepetitionPenaltyLogitsProcessor", (1.3,)),
    ],
)
def test_samplers_equal_hugging_face_processors(
    registry: gptzoo.Registry, name: str, params: dict, hf_name: str, hf_args: tuple
) -> None:
    from transformers.generation import logits_process

    logits = torch.randn(8, 50257) * 3  # a GPT-2-sized vocabulary, peaked like real logits
    ids = torch.randint(0, 50257, (8, 40))
    ours = registry.get("sampler", name).factory(**params)(logits.clone(), ids)
    theirs = getattr(logits_process, hf_name)(*hf_args)(ids, logits.clone())
    assert torch.equal(ours, theirs)


def test_sampler_chain_order_matters_and_seeds_repeat(registry: gptzoo.Registry) -> None:
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0]])
    ids = torch.zeros(1, 1, dtype=torch.long)
    # probabilities (0.474, 0.287, 0.174, 0.064) at temperature 1, (0.325, 0.275, 0.233, 0.167) at 3
    before = _chain(registry, ("temperature", {"temperature": 3.0}), ("top_p", {"p": 0.65})).transform(logits, ids)
    after = _chain(registry, ("top_p", {"p": 0.65}), ("temperature", {"temperature": 3.0})).transform(logits, ids)
    assert torch.isfinite(before).sum() == 3 and torch.isfinite(after).sum() == 2

    chain = _chain(registry, ("temperature", {"temperature": 1.0}))
    draw = lambda seed: chain(logits.expand(64, 4), ids.expand(64, 1), torch.Generator().manual_seed(seed))
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    greedy = _chain(registry, ("top_k", {"k": 3}), ("greedy", {}))
    assert greedy(logits, ids).tolist() == [0]


def test_sampler_errors(registry: gptzoo.Registry) -> None:
    with pytest.raises(GptzooError, match="sampler 'top_p': top_p p must be in \\(0, 1\\], got 1.5"):
        _chain(registry, ("top_p", {"p": 1.5}))
    with pytest.raises(GptzooError, match="temperature must be > 0"):
        _chain(registry, ("temperature", {"temperature": -1.0}))
    with pytest.raises(GptzooError, match="top_k k must be an integer >= 1, got 0"):
        _chain(registry, ("top_k", {"k": 0}))
    with pytest.raises(GptzooError, match="must come last"):
        _chain(registry, ("greedy", {}), ("top_k", {"k": 3}))
    with pytest.raises(gptzoo.UnknownComponentError, match="did you mean 'top_k'"):
        _chain(registry, ("topk", {}))

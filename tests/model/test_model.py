"""The assembled model: causality, attention variants, KV cache, norm placement, initialization."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tiny import BASES, PAIRS, tiny_model  # tests/ is on sys.path (pyproject: pythonpath)

import gptzoo
from gptzoo.errors import GptzooError
from gptzoo.interfaces import AttentionContext


@pytest.mark.parametrize(("base", "attention", "position"), PAIRS)
def test_later_tokens_never_change_earlier_logits(base: str, attention: str, position: str) -> None:
    model = tiny_model(base, f"model.attention={attention}", f"model.position={position}")
    V = model.recipe.model.vocab_size
    idx = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        ref = model(idx)
        for t in (0, 5, 22):
            changed = idx.clone()
            changed[:, t + 1] = (changed[:, t + 1] + 1 + torch.arange(2)) % V
            out = model(changed)
            assert torch.equal(out[:, : t + 1], ref[:, : t + 1]), f"position {t} saw token {t + 1}"
            assert not torch.equal(out[:, t + 1], ref[:, t + 1])


@pytest.mark.parametrize(("base", "attention", "position"), PAIRS)
def test_prefill_then_decode_equals_full_forward(base: str, attention: str, position: str) -> None:
    model = tiny_model(base, f"model.attention={attention}", f"model.position={position}")
    idx = torch.randint(0, model.recipe.model.vocab_size, (3, 23))
    with torch.no_grad():
        full = model(idx)
        cache = model.init_cache(3, 24)
        prefill = model(idx[:, :16], cache)
        steps = [model(idx[:, t : t + 1], cache) for t in range(16, 19)]
        chunk = model(idx[:, 19:], cache)  # 4 tokens after a cached prefix: needs the offset mask
    assert chunk.shape[1] == 4 and cache.length == 23
    torch.testing.assert_close(torch.cat([prefill, *steps, chunk], dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("base", "position"), list(itertools.product(BASES, gptzoo.get_registry().names("position"))))
def test_eager_and_sdpa_attention_agree(base: str, position: str) -> None:
    sdpa = tiny_model(base, f"model.position={position}", "model.attention=causal")
    eager = tiny_model(base, f"model.position={position}", "model.attention=eager")
    eager.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, sdpa.recipe.model.vocab_size, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(eager(idx), sdpa(idx), rtol=0, atol=1e-5)


def test_gqa_equals_mha_with_repeated_key_value_heads(registry: gptzoo.Registry) -> None:
    d, nh, nkv, hs = 32, 4, 2, 8
    factory = registry.get("attention", "eager").factory
    gqa = factory(d, nh, n_kv_head=nkv, head_dim=hs, bias=True)
    mha = factory(d, nh, n_kv_head=nh, head_dim=hs, bias=True)
    q, k, v = gqa.c_attn.weight.split((nh * hs, nkv * hs, nkv * hs))
    qb, kb, vb = gqa.c_attn.bias.split((nh * hs, nkv * hs, nkv * hs))
    repeat = lambda w: w.view(nkv, hs, *w.shape[1:]).repeat_interleave(nh // nkv, dim=0).reshape(nh * hs, *w.shape[1:])
    with torch.no_grad():
        mha.c_attn.weight.copy_(torch.cat([q, repeat(k), repeat(v)]))
        mha.c_attn.bias.copy_(torch.cat([qb, repeat(kb), repeat(vb)]))
        mha.c_proj.load_state_dict(gqa.c_proj.state_dict())
        x = torch.randn(2, 9, d)
        ctx = AttentionContext(0, None, None, is_causal=True)
        torch.testing.assert_close(gqa(x, ctx), mha(x, ctx))
    assert gqa.c_attn.weight.shape == ((nh + 2 * nkv) * hs, d)


def test_mqa_builds_and_caches_one_key_value_head() -> None:
    model = tiny_model("llama-tiny", "model.n_kv_head=1")
    cache = model.init_cache(2, 10)
    assert cache.layers[0].k.shape == (2, 1, 10, 16)
    with torch.no_grad():
        full = model(torch.arange(10).repeat(2, 1))
        cached = torch.cat([model(torch.arange(9).repeat(2, 1), cache), model(torch.full((2, 1), 9), cache)], 1)
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-5)


def test_pre_and_post_placement_follow_their_formulas() -> None:
    x = torch.randn(2, 6, 64)
    ctx = AttentionContext(0, None, None, is_causal=True)
    pre = tiny_model("gpt2-tiny")
    b = pre.blocks[0]
    with torch.no_grad():
        h = x + b.attn(b.ln_1(x), ctx)
        torch.testing.assert_close(b(x, ctx), h + b.mlp(b.ln_2(h)))
    assert isinstance(pre.ln_f, type(b.ln_1))

    post = tiny_model("gpt2-tiny", "model.norm_placement=post")
    b = post.blocks[0]
    with torch.no_grad():
        h = b.ln_1(x + b.attn(x, ctx))
        torch.testing.assert_close(b(x, ctx), b.ln_2(h + b.mlp(h)))
    assert isinstance(post.ln_f, torch.nn.Identity)
    n_params = lambda m: sum(p.numel() for p in m.parameters())
    assert n_params(pre) - n_params(post) == 2 * 64  # the final LayerNorm's weight and bias


def test_gpt2_initialization() -> None:
    model = tiny_model("gpt2-tiny", "model.n_embd=256", "model.d_ff=1024", "model.n_layer=8")
    std = lambda t: t.float().std().item()
    assert std(model.wte.weight) == pytest.approx(0.02, rel=0.02)
    assert std(model.position.wpe.weight) == pytest.approx(0.02, rel=0.05)
    assert std(model.blocks[0].attn.c_attn.weight) == pytest.approx(0.02, rel=0.02)
    assert std(model.blocks[0].mlp.c_fc.weight) == pytest.approx(0.02, rel=0.02)
    residual = 0.02 / math.sqrt(2 * 8)
    assert std(model.blocks[3].attn.c_proj.weight) == pytest.approx(residual, rel=0.05)
    assert std(model.blocks[3].mlp.c_proj.weight) == pytest.approx(residual, rel=0.03)
    assert all(torch.all(m.bias == 0) for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None)
    assert torch.all(model.blocks[0].ln_1.weight == 1) and torch.all(model.blocks[0].ln_1.bias == 0)


def test_tied_and_untied_heads() -> None:
    gpt2, llama = tiny_model("gpt2-tiny"), tiny_model("llama-tiny")
    assert gpt2.tied and gpt2.lm_head.weight is gpt2.wte.weight
    assert not llama.tied and llama.lm_head.weight is not llama.wte.weight
    assert "lm_head.weight" in gpt2.state_dict()  # tied: same tensor under both names


def test_forward_shapes_dtypes_and_devices() -> None:
    model = gptzoo.build_model("llama-tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    logits = model(torch.randint(0, 512, (2, 5)))
    assert logits.shape == (2, 5, 512) and logits.dtype == torch.bfloat16
    meta = gptzoo.build_model("gpt2-xl", device="meta")
    assert all(p.is_meta for p in meta.parameters())
    assert meta(torch.zeros(1, 8, dtype=torch.long, device="meta")).shape == (1, 8, 50257)


def test_too_long_sequences_are_clear_errors() -> None:
    model = tiny_model("gpt2-tiny")  # learned positions, context 128
    with pytest.raises(
        GptzooError, match="a sequence of 129 tokens is longer than the 128 positions that LearnedPosition encodes"
    ):
        model(torch.zeros(1, 129, dtype=torch.long))
    cache = model.init_cache(1, 8)
    model(torch.zeros(1, 8, dtype=torch.long), cache)
    with pytest.raises(GptzooError, match="the KV cache holds 8 positions, 9 were asked for"):
        model(torch.zeros(1, 1, dtype=torch.long), cache)
    rope = tiny_model("gpt2-tiny", "model.position=rope")  # extrapolates: no limit
    assert rope(torch.zeros(1, 130, dtype=torch.long)).shape == (1, 130, 50257)


@pytest.mark.parametrize(("base", "attention", "position"), PAIRS)
def test_left_padded_rows_equal_each_row_alone(base: str, attention: str, position: str) -> None:
    model = tiny_model(base, f"model.attention={attention}", f"model.position={position}")
    V = model.recipe.model.vocab_size
    lengths = (9, 4, 6)
    rows = [torch.randint(0, V, (n,)) for n in lengths]
    T = max(lengths)
    idx = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, row in enumerate(rows):
        idx[i, T - len(row) :], mask[i, T - len(row) :] = row, 1
    nxt = torch.randint(0, V, (len(rows), 3))
    with torch.no_grad():
        full = model(idx, attention_mask=mask)
        cache = model.init_cache(len(rows), T + 3)
        prefill = model(idx, cache, attention_mask=mask)
        steps = [model(nxt[:, t : t + 1], cache) for t in range(3)]
        for i, row in enumerate(rows):
            alone = model(torch.cat([row, nxt[i]])[None])[0]
            n = len(row)
            torch.testing.assert_close(full[i, T - n :], alone[:n], rtol=0, atol=1e-5)
            torch.testing.assert_close(prefill[i, T - n :], alone[:n], rtol=0, atol=1e-5)
            torch.testing.assert_close(torch.cat([s[i] for s in steps]), alone[n:], rtol=0, atol=1e-5)
    assert torch.isfinite(full).all()

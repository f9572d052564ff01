"""Gated DeltaNet (attention ``gated_deltanet``): the chunked form equals the step-by-step recurrence (values
and gradients, chunks that do not divide the prompt, a state to start from); the layer gives the numbers of
transformers' Qwen3-Next, Qwen3.5 and OLMo Hybrid layers on the same weights, over whole prompts and
left-padded rows; a prompt then one token at a time equals the whole; a constant-size cache whose bytes
kv_bytes says; contradictory parameters refused by name. (Every attention of the registry, this one included,
is held to cached = uncached, padded = alone and served = alone in tests/model/test_model.py,
tests/inference/test_generate.py and tests/serve/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

import gptzoo
from gptzoo.interfaces import AttentionContext, Positions
from gptzoo_plugins import _delta_rule
from gptzoo_plugins._gated_deltanet import GatedDeltaNet


def _inputs(B: int, H: int, T: int, dk: int, dv: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = _delta_rule.l2_normalize(torch.randn(B, H, T, dk, generator=g)) * dk**-0.5
    k = _delta_rule.l2_normalize(torch.randn(B, H, T, dk, generator=g))
    v = torch.randn(B, H, T, dv, generator=g)
    decay = -4 * torch.rand(B, H, T, generator=g)  # down to exp(-4) a token: strong and weak memory both
    beta = 2 * torch.rand(B, H, T, generator=g)  # up to 2 (negative eigenvalues)
    state = torch.randn(B, H, dk, dv, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize(("T", "chunk"), [(1, 64), (7, 3), (16, 4), (37, 8), (37, 64)])
def test_the_chunked_form_equals_the_recurrence(T: int, chunk: int) -> None:
    q, k, v, decay, beta, state = _inputs(2, 3, T, 5, 7, seed=T * chunk)
    want, want_state = _delta_rule.recurrent(q, k, v, decay, beta, state)
    got, got_state = _delta_rule.chunked(q, k, v, decay, beta, state, chunk)
    assert got.shape == (2, 3, T, 7) and got_state.shape == (2, 3, 5, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)


def test_the_chunked_form_has_the_recurrences_gradients() -> None:
    def grads(form):  # noqa: ANN001, ANN202
        inputs = [t.requires_grad_() for t in _inputs(1, 2, 11, 4, 3, seed=5)]
        out, state = form(*inputs)
        (out.square().sum() + state.sum()).backward()
        return [t.grad for t in inputs]

    for got, want in zip(grads(lambda *t: _delta_rule.chunked(*t, 4)), grads(_delta_rule.recurrent), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _ctx(start: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionContext:
    positions = Positions.padded(mask) if mask is not None else Positions.plain(start, x.shape[1], x.device)
    return AttentionContext(start, None, None, mask is None, positions)


def _ours(d: int, hk: int, hv: int, dk: int, dv: int, kernel: int, **kwargs: object) -> GatedDeltaNet:
    return GatedDeltaNet(
        d, 1, n_kv_head=1, head_dim=dk, bias=False, heads=hv, key_heads=hk, key_dim=dk, value_dim=dv,
        kernel=kernel, **kwargs,
    )  # fmt: skip


def _qwen3_next(d: int, hk: int, hv: int, dk: int, dv: int, kernel: int) -> tuple[GatedDeltaNet, torch.nn.Module]:
    """Qwen3-Next's layer: q, k, v and z interleaved per key head in one projection, b and a in another."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    config = Qwen3NextConfig(
        hidden_size=d, linear_num_value_heads=hv, linear_num_key_heads=hk, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel_dim=kernel, layer_types=["linear_attention"], num_hidden_layers=1,
    )  # fmt: skip
    theirs, ours, r = Qwen3NextGatedDeltaNet(config, 0), _ours(d, hk, hv, dk, dv, kernel, chunk=5), hv // hk
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
        q, k, v, z = theirs.in_proj_qkvz.weight.view(hk, 2 * dk + 2 * r * dv, d).split([dk, dk, r * dv, r * dv], 1)
        b, a = theirs.in_proj_ba.weight.view(hk, 2 * r, d).split([r, r], 1)
        ours.in_proj.weight.copy_(torch.cat([t.reshape(-1, d) for t in (q, k, v, z)]))
        ours.gate_proj.weight.copy_(torch.cat([t.reshape(-1, d) for t in (b, a)]))
        ours.c_proj.weight.copy_(theirs.out_proj.weight)
        _same_rest(ours, theirs, theirs.norm)
    return ours, theirs


def _qwen3_5(d: int, hk: int, hv: int, dk: int, dv: int, kernel: int) -> tuple[GatedDeltaNet, torch.nn.Module]:
    """Qwen3.5's layer: q, k and v in one projection, z, b and a each in its own."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = Qwen3_5TextConfig(
        hidden_size=d, linear_num_value_heads=hv, linear_num_key_heads=hk, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel_dim=kernel, layer_types=["linear_attention"], num_hidden_layers=1,
    )  # fmt: skip
    theirs, ours = Qwen3_5GatedDeltaNet(config, 0), _ours(d, hk, hv, dk, dv, kernel, chunk=64)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
        ours.in_proj.weight.copy_(torch.cat([theirs.in_proj_qkv.weight, theirs.in_proj_z.weight]))
        ours.gate_proj.weight.copy_(torch.cat([theirs.in_proj_b.weight, theirs.in_proj_a.weight]))
        ours.c_proj.weight.copy_(theirs.out_proj.weight)
        _same_rest(ours, theirs, theirs.norm)
    return ours, theirs


def _olmo_hybrid(d: int, hk: int, hv: int, dk: int, dv: int, kernel: int) -> tuple[GatedDeltaNet, torch.nn.Module]:
    """OLMo Hybrid's layer: a projection each, beta in (0, 2), an output norm of epsilon 1e-5."""
    from transformers import OlmoHybridConfig
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet

    config = OlmoHybridConfig(
        hidden_size=d, linear_num_value_heads=hv, linear_num_key_heads=hk, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel_dim=kernel, linear_allow_neg_eigval=True,
        layer_types=["linear_attention", "full_attention"], num_hidden_layers=2,  # it wants one attention layer
    )  # fmt: skip
    theirs = OlmoHybridGatedDeltaNet(config, 0)
    ours = _ours(d, hk, hv, dk, dv, kernel, chunk=4, neg_eigval=True, norm_eps=1e-5)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
        parts = (theirs.q_proj, theirs.k_proj, theirs.v_proj, theirs.g_proj)
        ours.in_proj.weight.copy_(torch.cat([p.weight for p in parts]))
        ours.gate_proj.weight.copy_(torch.cat([theirs.b_proj.weight, theirs.a_proj.weight]))
        ours.c_proj.weight.copy_(theirs.o_proj.weight)
        _same_rest(ours, theirs, theirs.o_norm)
    return ours, theirs


def _same_rest(ours: GatedDeltaNet, theirs: torch.nn.Module, norm: torch.nn.Module) -> None:
    ours.conv.weight.copy_(theirs.conv1d.weight)
    ours.A_log.copy_(theirs.A_log)
    ours.dt_bias.copy_(theirs.dt_bias)
    ours.norm.weight.copy_(norm.weight)


@pytest.mark.parametrize(
    ("pair", "shape"),
    [
        (_qwen3_next, (24, 2, 6, 5, 7, 4)),
        (_qwen3_next, (18, 3, 3, 6, 4, 3)),
        (_qwen3_5, (20, 1, 3, 4, 6, 4)),
        (_olmo_hybrid, (22, 3, 6, 3, 5, 3)),
    ],
    ids=["qwen3-next", "qwen3-next-k3", "qwen3.5", "olmo-hybrid"],
)
def test_equals_transformers(pair, shape: tuple[int, ...]) -> None:  # noqa: ANN001
    ours, theirs = pair(*shape)
    x = torch.randn(3, 13, shape[0], generator=torch.Generator().manual_seed(sum(shape)))
    mask = torch.ones(3, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, :12] = 0  # one token
    with torch.no_grad():
        torch.testing.assert_close(ours(x, _ctx(0, x)), theirs(x), rtol=0, atol=1e-4)
        got, want = ours(x, _ctx(0, x, mask)), theirs(x, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-4)


@pytest.mark.parametrize("first", [1, 2, 6])
def test_a_prompt_then_one_token_at_a_time_equals_the_whole(first: int) -> None:
    ours, _ = _qwen3_next(16, 2, 4, 4, 3, 4)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(first))
    cache = ours.init_cache(2, 32)
    with torch.no_grad():
        whole = ours(x, _ctx(0, x))
        parts = [ours(x[:, :first], _ctx(0, x[:, :first]), cache)]
        parts += [ours(x[:, t : t + 1], _ctx(t, x[:, t : t + 1]), cache) for t in range(first, 11)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-4, atol=1e-5)
    channels = 2 * 2 * 4 + 4 * 3
    state = 2 * (channels * 3 * 4 + 4 * 4 * 3 * 4)  # conv inputs in float32, the delta rule's state in float32
    assert cache.nbytes == ours.kv_bytes(2, 32, torch.float32) == ours.kv_bytes(2, 4096, torch.float32) == state
    assert ours.state_bytes(1, torch.bfloat16) == channels * 3 * 2 + 4 * 4 * 3 * 4  # the state stays float32
    assert cache.max_len == 32


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("kernel = 0", r"kernel=0 must be at least 1 \(the taps of the convolution\)"),
        ("chunk = 0", r"chunk=0 must be at least 1 \(tokens per chunk of the chunked form\)"),
        ("heads = 6, key_heads = 4", r"heads=6 must be a multiple of key_heads=4 \(each key head serves as many\)"),
        ("norm_eps = 0.0", r"norm_eps=0.0 must be above 0"),
        ("heads = -1", r"heads=-1 must be 0 \(the recipe's n_head\) or at least 1"),
        ("key_dim = -3", r"key_dim=-3 must be 0 \(the recipe's head_dim\) or at least 1"),
        ("key_heads = 3", r"heads=4 must be a multiple of key_heads=3 \(each key head serves as many\)"),  # n_head 4
    ],
)
def test_contradictory_parameters_are_refused_by_name(setting: str, message: str) -> None:
    with pytest.raises(gptzoo.RecipeError, match=message):
        gptzoo.load_recipe("llama-tiny", [f'model.attention={{ name = "gated_deltanet", {setting} }}'])

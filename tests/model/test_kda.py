"""Kimi delta attention (attention ``kda``): the per-channel delta rule's chunked form equals its recurrence (values
and gradients, chunks that do not divide the prompt, a state to start from) and, with one decay for every channel,
gated DeltaNet's; the layer gives the numbers of transformers' Kimi Linear layer on the same weights, over whole
prompts and left-padded rows; a prompt then one token at a time equals the whole; a constant-size cache; bad
parameters refused by name. (Every attention of the registry, this one included, is held to cached = uncached,
padded = alone and served = alone in tests/model/test_model.py, tests/inference/test_generate.py and
tests/serve/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

import gptzoo
from gptzoo.interfaces import AttentionContext, Positions
from gptzoo_plugins import _delta_rule
from gptzoo_plugins._kda import KimiDeltaAttention


def _inputs(B: int, H: int, T: int, dk: int, dv: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = _delta_rule.l2_normalize(torch.randn(B, H, T, dk, generator=g)) * dk**-0.5
    k = _delta_rule.l2_normalize(torch.randn(B, H, T, dk, generator=g))
    v = torch.randn(B, H, T, dv, generator=g)
    decay = -4 * torch.rand(B, H, T, dk, generator=g)  # each channel its own: down to exp(-4) a token
    beta = torch.rand(B, H, T, generator=g)
    state = torch.randn(B, H, dk, dv, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize(("T", "chunk"), [(1, 64), (7, 3), (16, 4), (37, 8)])
def test_the_chunked_form_equals_the_recurrence(T: int, chunk: int) -> None:
    q, k, v, decay, beta, state = _inputs(2, 3, T, 5, 7, seed=T * chunk)
    want, want_state = _delta_rule.recurrent_channels(q, k, v, decay, beta, state)
    got, got_state = _delta_rule.chunked_channels(q, k, v, decay, beta, state, chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)


def test_one_decay_for_every_channel_is_gated_deltanet_s_rule() -> None:
    q, k, v, decay, beta, state = _inputs(2, 3, 19, 5, 7, seed=4)
    per_head = decay[..., 0]
    want = _delta_rule.chunked(q, k, v, per_head, beta, state, 4)
    got = _delta_rule.chunked_channels(q, k, v, per_head[..., None].expand_as(decay), beta, state, 4)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_chunked_form_has_the_recurrences_gradients() -> None:
    def grads(form):  # noqa: ANN001, ANN202
        inputs = [t.requires_grad_() for t in _inputs(1, 2, 11, 4, 3, seed=5)]
        out, state = form(*inputs)
        (out.square().sum() + state.sum()).backward()
        return [t.grad for t in inputs]

    pairs = zip(
        grads(lambda *t: _delta_rule.chunked_channels(*t, 4)), grads(_delta_rule.recurrent_channels), strict=True
    )
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _ctx(start: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionContext:
    positions = Positions.padded(mask) if mask is not None else Positions.plain(start, x.shape[1], x.device)
    return AttentionContext(start, None, None, mask is None, positions)


def _pair(d: int, heads: int, size: int, kernel: int) -> tuple[KimiDeltaAttention, torch.nn.Module]:
    """transformers' Kimi Linear layer (its torch path) and ours on the same random weights: q_proj, k_proj and
    v_proj one after another are our in_proj; the forget gate's and the output gate's low-rank pairs, b_proj,
    A_log, dt_bias, o_norm and o_proj as they are."""
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    config = KimiLinearConfig(
        hidden_size=d, linear_num_heads=heads, linear_head_dim=size, linear_conv_kernel_dim=kernel,
        num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=1e-5,
    )  # fmt: skip
    theirs = KimiLinearDeltaAttention(config, 0)
    ours = KimiDeltaAttention(d, 1, n_kv_head=1, head_dim=1, bias=False, heads=heads, head_size=size, kernel=kernel)
    ours.chunk = 4
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
        theirs.forget_gate.A_log.copy_(torch.rand(1, 1, heads, 1).mul(2).log1p())
        ours.in_proj.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
        ours.conv.weight.copy_(theirs.conv1d.weight)
        for name in ("f_a_proj", "f_b_proj"):
            getattr(ours, name).weight.copy_(getattr(theirs.forget_gate, name).weight)
        ours.A_log.copy_(theirs.forget_gate.A_log)
        ours.dt_bias.copy_(theirs.forget_gate.dt_bias)
        for name in ("b_proj", "g_a_proj", "g_b_proj"):
            getattr(ours, name).weight.copy_(getattr(theirs, name).weight)
        ours.norm.weight.copy_(theirs.o_norm.weight)
        ours.c_proj.weight.copy_(theirs.o_proj.weight)
    return ours, theirs


@pytest.mark.parametrize("shape", [(12, 3, 5, 4), (10, 2, 6, 3)], ids=["three-heads", "kernel-3"])
def test_equals_transformers(shape: tuple[int, ...]) -> None:
    ours, theirs = _pair(*shape)
    x = torch.randn(2, 13, shape[0], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(x, _ctx(0, x)), theirs(x), rtol=1e-4, atol=1e-5)
        mask = torch.ones(2, 13, dtype=torch.long)
        mask[1, :4] = 0  # row 1 is left-padded: its last 9 tokens alone
        padded = ours(x, _ctx(0, x, mask.bool()))
        torch.testing.assert_close(padded, theirs(x, attention_mask=mask), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(padded[1:, 4:], ours(x[1:, 4:], _ctx(0, x[1:, 4:])), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("first", [1, 6, 9])
def test_a_prompt_then_one_token_at_a_time_equals_the_whole(first: int) -> None:
    ours, _ = _pair(12, 3, 5, 4)
    x = torch.randn(1, 11, 12, generator=torch.Generator().manual_seed(first))
    cache = ours.init_cache(1, 64)
    with torch.no_grad():
        whole = ours(x, _ctx(0, x))
        parts = [ours(x[:, :first], _ctx(0, x[:, :first]), cache)]
        parts += [ours(x[:, t : t + 1], _ctx(t, x[:, t : t + 1]), cache) for t in range(first, 11)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-5, atol=1e-5)
    # 3 heads of a 5 x 5 float32 state, and the convolution's 3 last inputs of 45 channels
    assert cache.nbytes == ours.kv_bytes(1, 64, torch.float32) == 3 * 5 * 5 * 4 + 45 * 3 * 4


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("kernel=0", "kernel=0 must be at least 1 (the taps of the convolution)"),
        ("head_size=-2", "head_size=-2 must be 0 (the recipe's head_dim) or at least 1"),
        ("norm_eps=0.0", "norm_eps=0.0 must be above 0"),
    ],
)
def test_bad_parameters_are_refused_by_name(setting: str, message: str) -> None:
    with pytest.raises(gptzoo.errors.RecipeError) as info:
        gptzoo.load_recipe("llama-tiny", [f"model.attention={{name='kda', {setting}}}"])
    assert info.value.problems == [f"[model] attention (kda): {message}"]

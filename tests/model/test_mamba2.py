"""Mamba-2 (attention ``mamba2``): state space duality's chunked form equals the step-by-step recurrence
(values and gradients, chunks that do not divide the prompt, a state to start from); the layer gives the numbers
of transformers' Granite 4.0-H Mamba-2 layer on the same weights, over whole prompts and left-padded rows; a
prompt then one token at a time equals the whole; a constant-size cache whose bytes kv_bytes says; contradictory
parameters refused by name. (Every attention of the registry, this one included, is held to cached = uncached,
padded = alone and served = alone in tests/model/test_model.py, tests/inference/test_generate.py and
tests/serve/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

import gptzoo
from gptzoo.interfaces import AttentionContext, Positions
from gptzoo_plugins import _ssd
from gptzoo_plugins._mamba2 import Mamba2


def _inputs(B: int, H: int, T: int, N: int, P: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, T, N, generator=g), torch.randn(B, H, T, N, generator=g)
    v = torch.randn(B, H, T, P, generator=g)
    decay = -4 * torch.rand(B, H, T, generator=g)  # down to exp(-4) a token: strong and weak memory both
    state = torch.randn(B, H, N, P, generator=g)
    return q, k, v, decay, state


@pytest.mark.parametrize(("T", "chunk"), [(1, 64), (7, 3), (16, 4), (37, 8), (37, 64)])
def test_the_chunked_form_equals_the_recurrence(T: int, chunk: int) -> None:
    q, k, v, decay, state = _inputs(2, 3, T, 5, 7, seed=T * chunk)
    want, want_state = _ssd.recurrent(q, k, v, decay, state)
    got, got_state = _ssd.chunked(q, k, v, decay, state, chunk)
    assert got.shape == (2, 3, T, 7) and got_state.shape == (2, 3, 5, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)


def test_the_chunked_form_has_the_recurrences_gradients() -> None:
    def grads(form):  # noqa: ANN001, ANN202
        inputs = [t.requires_grad_() for t in _inputs(1, 2, 11, 4, 3, seed=5)]
        out, state = form(*inputs)
        (out.square().sum() + state.sum()).backward()
        return [t.grad for t in inputs]

    for got, want in zip(grads(lambda *t: _ssd.chunked(*t, 4)), grads(_ssd.recurrent), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _ctx(start: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionContext:
    positions = Positions.padded(mask) if mask is not None else Positions.plain(start, x.shape[1], x.device)
    return AttentionContext(start, None, None, mask is None, positions)


def _pair(d: int, heads: int, groups: int, state: int, kernel: int, conv_bias: bool) -> tuple[Mamba2, torch.nn.Module]:
    """transformers' Granite 4.0-H Mamba-2 layer (its torch path) and ours, on the same random weights: in_proj
    [z, x, B, C, dt], conv1d over x, B and C, A_log, D, dt_bias, the grouped gated norm, out_proj."""
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

    config = GraniteMoeHybridConfig(
        hidden_size=d, mamba_n_heads=heads, mamba_n_groups=groups, mamba_d_state=state, mamba_d_conv=kernel,
        mamba_expand=2, mamba_chunk_size=5, mamba_conv_bias=conv_bias, num_hidden_layers=1, rms_norm_eps=1e-5,
    )  # fmt: skip
    theirs = GraniteMoeHybridMambaLayer(config, 0)
    ours = Mamba2(
        d, 1, n_kv_head=1, head_dim=1, bias=False, heads=heads, value_dim=2 * d // heads, state=state, groups=groups,
        kernel=kernel, conv_bias=conv_bias, chunk=4,
    )  # fmt: skip
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
        theirs.A_log.copy_(torch.rand(heads).mul(2).log1p())  # A in [1, 3): decays a chunk does not flatten
        for mine, theirs_ in (
            (ours.in_proj.weight, theirs.in_proj.weight),
            (ours.conv.weight, theirs.conv1d.weight),
            (ours.A_log, theirs.A_log),
            (ours.D, theirs.D),
            (ours.dt_bias, theirs.dt_bias),
            (ours.norm.weight, theirs.norm.weight),
            (ours.c_proj.weight, theirs.out_proj.weight),
        ):
            mine.copy_(theirs_)
        if conv_bias:
            ours.conv.bias.copy_(theirs.conv1d.bias)
    return ours, theirs


@pytest.mark.parametrize(
    ("shape", "conv_bias"), [((12, 6, 3, 5, 4), True), ((10, 5, 1, 3, 3), False)], ids=["groups", "one-group"]
)
def test_equals_transformers(shape: tuple[int, ...], conv_bias: bool) -> None:
    ours, theirs = _pair(*shape, conv_bias=conv_bias)
    x = torch.randn(2, 13, shape[0], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(x, _ctx(0, x)), theirs(x), rtol=1e-4, atol=1e-5)
        mask = torch.ones(2, 13, dtype=torch.long)
        mask[1, :4] = 0  # row 1 is left-padded: its last 9 tokens alone
        padded = ours(x, _ctx(0, x, mask.bool()))
        torch.testing.assert_close(padded, theirs(x, attention_mask=mask), rtol=1e-4, atol=1e-5)
        alone = ours(x[1:, 4:], _ctx(0, x[1:, 4:]))
        torch.testing.assert_close(padded[1:, 4:], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("first", [1, 6, 9])
def test_a_prompt_then_one_token_at_a_time_equals_the_whole(first: int) -> None:
    ours, _ = _pair(12, 6, 3, 5, 4, conv_bias=True)
    x = torch.randn(1, 11, 12, generator=torch.Generator().manual_seed(first))
    cache = ours.init_cache(1, 64)
    with torch.no_grad():
        whole = ours(x, _ctx(0, x))
        parts = [ours(x[:, :first], _ctx(0, x[:, :first]), cache)]
        parts += [ours(x[:, t : t + 1], _ctx(t, x[:, t : t + 1]), cache) for t in range(first, 11)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-5, atol=1e-5)
    # 6 heads of 4 channels x state 5 in float32, and the convolution's 3 last inputs of 24 + 2 x 3 x 5 channels
    assert cache.nbytes == ours.kv_bytes(1, 64, torch.float32) == 6 * 5 * 4 * 4 + 54 * 3 * 4
    assert ours.kv_bytes(1, 10_000, torch.float32) == ours.kv_bytes(1, 64, torch.float32)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("heads=6, groups=4", "heads=6 must be a multiple of groups=4 (each group serves as many heads)"),
        ("state=0", "state=0 must be at least 1 (the state size per head)"),
        ("kernel=0", "kernel=0 must be at least 1 (the taps of the convolution)"),
        ("heads=-1", "heads=-1 must be 0 (the recipe's n_head) or at least 1"),
        ("norm_eps=0.0", "norm_eps=0.0 must be above 0"),
    ],
)
def test_contradictory_parameters_are_refused_by_name(setting: str, message: str) -> None:
    override = f"model.attention={{name='mamba2', {setting}}}"
    with pytest.raises(gptzoo.errors.RecipeError) as info:
        gptzoo.load_recipe("llama-tiny", [override])
    assert info.value.problems == [f"[model] attention (mamba2): {message}"]

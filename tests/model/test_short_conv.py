"""LFM2's gated short convolution (attention ``short_conv``): transformers' Lfm2ShortConv's numbers on the same
weights, over a whole prompt, left-padded rows and one token at a time after a cache; a constant-size cache
whose bytes kv_bytes says; a kernel of no taps refused by name. (Every attention x position pair of the
registry, this one included, is held to cached = uncached, padded = alone and served = alone in
tests/model/test_model.py, tests/inference/test_generate.py and tests/serve/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

import gptzoo
from gptzoo.interfaces import AttentionContext, Positions
from gptzoo_plugins._short_conv import ShortConv


def _pair(d: int, kernel: int, bias: bool) -> tuple[ShortConv, torch.nn.Module]:
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    torch.manual_seed(kernel)
    ours = ShortConv(d, 1, n_kv_head=1, head_dim=d, bias=bias, kernel=kernel)
    config = Lfm2Config(hidden_size=d, conv_L_cache=kernel, conv_bias=bias, layer_types=["conv"], num_hidden_layers=1)
    theirs = Lfm2ShortConv(config, 0)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
        theirs.in_proj.weight.copy_(ours.in_proj.weight)
        theirs.conv.weight.copy_(ours.conv.weight)
        theirs.out_proj.weight.copy_(ours.c_proj.weight)
        if bias:
            theirs.in_proj.bias.copy_(ours.in_proj.bias)
            theirs.conv.bias.copy_(ours.conv.bias)
            theirs.out_proj.bias.copy_(ours.c_proj.bias)
    return ours, theirs


def _ctx(start: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionContext:
    positions = Positions.padded(mask) if mask is not None else Positions.plain(start, x.shape[1], x.device)
    return AttentionContext(start, None, None, mask is None, positions)


@pytest.mark.parametrize(("d", "kernel", "bias"), [(24, 3, False), (20, 4, True), (12, 1, False)])
def test_equals_transformers_lfm2_short_conv(d: int, kernel: int, bias: bool) -> None:
    ours, theirs = _pair(d, kernel, bias)
    x = torch.randn(3, 11, d, generator=torch.Generator().manual_seed(d))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, :10] = 0  # one token
    with torch.no_grad():
        torch.testing.assert_close(ours(x, _ctx(0, x)), theirs(x), rtol=0, atol=1e-5)
        got, want = ours(x, _ctx(0, x, mask)), theirs(x, attention_mask=mask)
        alone = [ours(x[i : i + 1, first:], _ctx(0, x[i : i + 1, first:]))[0] for i, first in enumerate((0, 4, 10))]
    real = mask.bool()
    if not bias:  # transformers zeroes the padding before in_proj, whose bias then reaches the convolution
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    for i, first in enumerate((0, 4, 10)):  # each padded row as it is alone (matmuls of other shapes)
        torch.testing.assert_close(got[i, first:], alone[i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("first", [1, 2, 5])
def test_a_prompt_then_one_token_at_a_time_equals_the_whole(first: int) -> None:
    """Prefills shorter than the kernel's reach (its state still partly the zeros before the first token)."""
    ours, _ = _pair(16, 4, True)
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(first))
    cache = ours.init_cache(2, 32)
    with torch.no_grad():
        whole = ours(x, _ctx(0, x))
        parts = [ours(x[:, :first], _ctx(0, x[:, :first]), cache)]
        parts += [ours(x[:, t : t + 1], _ctx(t, x[:, t : t + 1]), cache) for t in range(first, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-4, atol=1e-5)  # other matmul shapes
    assert (
        cache.nbytes == ours.kv_bytes(2, 32, torch.float32) == ours.kv_bytes(2, 4096, torch.float32) == 2 * 16 * 3 * 4
    )
    assert cache.max_len == 32


def test_a_kernel_without_taps_is_refused_by_name() -> None:
    with pytest.raises(gptzoo.RecipeError, match=r"kernel=0 must be at least 1 \(the taps of the convolution\)"):
        gptzoo.load_recipe("llama-tiny", ['model.attention={ name = "short_conv", kernel = 0 }'])

"""The gated short convolution of LFM2 (Liquid AI, 2025), a token mixer in the attention's place.

``in_proj`` (d -> 3d, rows B, then C, then x) gives two gates and an input; B * x goes through a causal
depthwise convolution of ``kernel`` taps (each channel its own filter, ``conv.weight`` (d, 1, kernel)),
the result is gated by C and projected back (``c_proj``, LFM2's ``out_proj``):

    y = c_proj(C * conv(B * x))

A token sees itself and the ``kernel - 1`` before it: the layer keeps no keys, and its cache is a
constant-size state, the last ``kernel - 1`` inputs of the convolution (:class:`ConvState`), whatever
the length. A whole prompt is one convolution over it (after the cached inputs); a cached step takes
the state and the new inputs, as transformers' Lfm2ShortConv does (its ``slow_forward``), and the two
give the same numbers. Left padding is zeroed at the convolution's input (after in_proj, whose bias would
otherwise reach it), so a padded row sees exactly the zeros a lone row starts from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import AttentionContext


class ConvState:
    """A short convolution's cache: the last ``kernel - 1`` inputs of each sequence (B, d, kernel - 1),
    zeros before its first token. It accepts ``max_len`` positions in all while holding a fixed size."""

    def __init__(
        self,
        batch_size: int,
        channels: int,
        kernel: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.state = torch.zeros(batch_size, channels, kernel - 1, device=device, dtype=dtype)
        self.positions = max_len

    @property
    def max_len(self) -> int:
        return self.positions

    @property
    def nbytes(self) -> int:
        return self.state.nbytes


class ShortConv(nn.Module):
    """Gated short convolution (LFM2): c_proj(C * conv(B * x)), a causal depthwise convolution of a few taps.

    ``kernel``: the taps (LFM2's conv_L_cache, 3); the module docstring says the rest."""

    def __init__(
        self, d_model: int, n_head: int, *, n_kv_head: int, head_dim: int, bias: bool, kernel: int = 3
    ) -> None:
        super().__init__()
        problems = self.check(kernel=kernel)
        if problems:
            raise ValueError("; ".join(problems))
        self.d_model, self.kernel = d_model, kernel
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model, bias=bias)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)

    @staticmethod
    def check(*, kernel: int = 3, **_: object) -> list[str]:
        """What is wrong with these parameters (the recipe's validation reads it)."""
        return [] if kernel >= 1 else [f"kernel={kernel} must be at least 1 (the taps of the convolution)"]

    def forward(self, x: Tensor, ctx: AttentionContext, cache: ConvState | None = None) -> Tensor:
        T = x.shape[1]
        real = None if ctx.positions is None or ctx.positions.key_mask is None else ctx.positions.key_mask[:, -T:]
        b, c, h = self.in_proj(x).transpose(1, 2).chunk(3, dim=1)  # (B, d, T) each
        u = b * h
        if real is not None:  # left padding: zeros at the convolution's input, as before a lone row's first token
            u = u * real[:, None, :].to(u.dtype)
        before = (
            u.new_zeros(u.shape[0], self.d_model, self.kernel - 1) if cache is None or ctx.start == 0 else cache.state
        )
        full = torch.cat([before, u], dim=2)  # the inputs the T outputs read: kernel - 1 earlier ones, then these
        if cache is not None:
            cache.state.copy_(full[:, :, full.shape[2] - (self.kernel - 1) :])
        y = c * F.conv1d(full, self.conv.weight, self.conv.bias, groups=self.d_model)
        return self.c_proj(y.transpose(1, 2))

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> ConvState:
        return ConvState(batch_size, self.d_model, self.kernel, max_len, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        return self.state_bytes(batch_size, dtype)

    def state_bytes(self, batch_size: int, dtype: torch.dtype) -> int:
        """All of its cache: the last kernel - 1 inputs, whatever the length."""
        return batch_size * self.d_model * (self.kernel - 1) * dtype.itemsize

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        tokens = batch * seq_len
        return {
            "in_proj": linear_flops(tokens, self.in_proj),
            "conv": 2 * tokens * self.d_model * self.kernel,
            "c_proj": linear_flops(tokens, self.c_proj),
        }

"""What the recurrent token mixers share (gated DeltaNet, Kimi delta attention, Mamba-2): a short causal
depthwise convolution before the recurrence, and a cache of constant size that holds the convolution's last
inputs and the recurrence's state (:class:`RecurrentState`). :class:`RecurrentMixer` is their base: it runs the
convolution over a pass's tokens after the cached ones and gives the cache and its bytes; each mixer says what
its state is (``state_shape``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.interfaces import AttentionContext


def size_problems(*sizes: tuple[str, int, str]) -> list[str]:
    """A problem for each size (name, value, what 0 takes) below 0."""
    return [f"{name}={value} must be 0 (the {default}) or at least 1" for name, value, default in sizes if value < 0]


def count_problems(*counts: tuple[str, int, str], kernel: int, chunk: int) -> list[str]:
    """A problem for each count (name, value, what it counts) below 1, the convolution's taps and the chunk last."""
    counts += (
        ("kernel", kernel, "the taps of the convolution"),
        ("chunk", chunk, "tokens per chunk of the chunked form"),
    )
    return [f"{name}={value} must be at least 1 ({what})" for name, value, what in counts if value < 1]


def eps_problems(norm_eps: float) -> list[str]:
    """A problem for an output norm's epsilon that is not above 0."""
    return [f"norm_eps={norm_eps} must be above 0"] if norm_eps <= 0 else []


class RecurrentState:
    """A recurrent mixer's cache: the convolution's last ``kernel - 1`` inputs (B, channels, kernel - 1) in the
    cache dtype and the recurrence's state (B, *state_shape) in float32. It accepts ``max_len`` positions in all
    while holding a fixed size."""

    def __init__(
        self,
        batch_size: int,
        channels: int,
        kernel: int,
        state_shape: tuple[int, ...],
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.conv = torch.zeros(batch_size, channels, kernel - 1, device=device, dtype=dtype)
        self.state = torch.zeros(batch_size, *state_shape, device=device, dtype=torch.float32)
        self.positions = max_len

    @property
    def max_len(self) -> int:
        return self.positions

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.state.nbytes


class RecurrentMixer(nn.Module):
    """The base of a recurrent token mixer: its depthwise convolution ``conv`` over ``channels`` channels of
    ``kernel`` taps, and its cache. A subclass sets those three and says its state's shape (``state_shape``)."""

    channels: int
    kernel: int
    conv: nn.Conv1d

    @property
    def state_shape(self) -> tuple[int, ...]:
        """The recurrence's state of one sequence (its float32 tensor's shape)."""
        raise NotImplementedError

    def convolve(
        self, x: Tensor, ctx: AttentionContext, cache: RecurrentState | None
    ) -> tuple[Tensor, bool, Tensor | None]:
        """SiLU of the causal convolution of ``x`` (B, T, channels) after the cached inputs (none for a fresh
        sequence), as (B, channels, T); whether the pass starts the sequence (no cached state to read); and which
        of the pass's tokens are real (None without padding). Left padding is zeroed at the convolution's input,
        as before a lone row's first token; the cache keeps the last kernel - 1 inputs."""
        B, T, _ = x.shape
        real = None if ctx.positions is None or ctx.positions.key_mask is None else ctx.positions.key_mask[:, -T:]
        if real is not None:
            x = x * real[..., None].to(x.dtype)
        x = x.transpose(1, 2)  # (B, channels, T)
        fresh = cache is None or ctx.start == 0
        before = x.new_zeros(B, self.channels, self.kernel - 1) if fresh else cache.conv
        full = torch.cat([before, x], dim=2)  # the inputs the T outputs read: kernel - 1 earlier ones, then these
        if cache is not None:
            cache.conv.copy_(full[:, :, full.shape[2] - (self.kernel - 1) :])
        return F.silu(F.conv1d(full, self.conv.weight, self.conv.bias, groups=self.channels)), fresh, real

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RecurrentState:
        shape = self.state_shape
        return RecurrentState(batch_size, self.channels, self.kernel, shape, max_len, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        return self.state_bytes(batch_size, dtype)

    def state_bytes(self, batch_size: int, dtype: torch.dtype) -> int:
        """All of its cache: the convolution's last kernel - 1 inputs and the float32 state, whatever the length."""
        conv = self.channels * (self.kernel - 1) * dtype.itemsize
        return batch_size * (conv + math.prod(self.state_shape) * 4)

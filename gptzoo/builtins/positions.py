"""Position encodings.

- none: no position information (NoPE; causal attention still orders tokens).
- learned: a trained table of absolute positions (GPT-2, Radford et al., 2019).
- sinusoidal: the fixed sin/cos table of Vaswani et al. (2017), sin at even and cos at odd features.
- rope: rotary embeddings (Su et al., 2021) in HF Llama's rotate-half convention, base ``theta``.
- alibi: linear distance biases with the head slopes of Press et al. (2022), ``get_slopes`` in
  github.com/ofirpress/attention_with_linear_biases.

Tables and frequencies are computed from constructor arguments on the positions' device, never
stored as buffers, so a model built on the meta device and loaded later needs no re-initialization.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gptzoo.hookspecs import hookimpl
from gptzoo.interfaces import Position, TensorMap


class NoPosition(Position):
    """No position encoding (NoPE)."""

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int) -> None:
        super().__init__()


class LearnedPosition(Position):
    """Learned absolute position embeddings (GPT-2); limited to context_length positions."""

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int) -> None:
        super().__init__()
        self.max_positions = context_length
        self.wpe = nn.Embedding(
            context_length, n_embd, _weight=torch.empty(context_length, n_embd)
        )  # init: GPT.init_weights

    def embed(self, positions: Tensor) -> Tensor:
        return self.wpe(positions)

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [TensorMap("wpe.weight", ("wpe.weight",))] if family == "gpt2" else None


class SinusoidalPosition(Position):
    """Fixed sinusoidal position embeddings (Vaswani et al., 2017)."""

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int, base: float = 10000.0) -> None:
        super().__init__()
        self.n_embd, self.base = n_embd, base

    @staticmethod
    def check(*, n_embd: int, base: float = 10000.0, **_: object) -> list[str]:
        problems = [f"sinusoidal positions need an even n_embd, got {n_embd}"] if n_embd % 2 else []
        if not (math.isfinite(base) and base > 1):
            problems.append(f"base must be a number > 1, got {base}")
        return problems

    def embed(self, positions: Tensor) -> Tensor:
        i = torch.arange(0, self.n_embd, 2, device=positions.device, dtype=torch.float32)
        angles = positions.float()[..., None] * torch.exp(i * (-math.log(self.base) / self.n_embd))  # (B, T, d/2)
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (B, T, d): sin, cos interleaved


class RotateHalf:
    """q and k rotated by precomputed cos/sin (B, T, hs), HF Llama's rotate-half convention."""

    def __init__(self, cos: Tensor, sin: Tensor) -> None:
        self.cos, self.sin = cos[:, None], sin[:, None]  # (B, 1, T, hs): the same for every head

    def apply(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos.to(q.dtype), self.sin.to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RoPE(Position):
    """Rotary position embeddings (Su et al., 2021), rotate-half convention as in HF Llama."""

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    @staticmethod
    def check(*, head_dim: int, theta: float = 10000.0, **_: object) -> list[str]:
        problems = [f"rope needs an even head_dim, got {head_dim}"] if head_dim % 2 else []
        if not (math.isfinite(theta) and theta > 0):
            problems.append(f"rope theta must be a positive number, got {theta}")
        return problems

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [] if family == "llama" else None  # computed, not stored

    def hf_config(self, family: str) -> dict[str, float] | None:
        return {"rope_theta": self.theta} if family == "llama" else None

    def rotary(self, positions: Tensor) -> RotateHalf:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=positions.device).float()
        inv_freq = 1.0 / (self.theta ** (exponents / self.head_dim))  # (hs/2,)
        freqs = positions.float()[..., None] * inv_freq  # (B, T, hs/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hs)
        return RotateHalf(emb.cos(), emb.sin())


def alibi_slopes(n_head: int) -> list[float]:
    """The ALiBi paper's head slopes: a geometric sequence from 2^(-8/n); for n not a power of 2,
    those of the closest lower power of 2 followed by every other slope of twice that many."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_head).is_integer():
        return power_of_2(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_2(closest) + power_of_2(2 * closest)[0::2][: n_head - closest]


class ALiBi(Position):
    """Attention with linear biases (Press et al., 2022): score += slope_h * (j - i) for key j <= query i."""

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int) -> None:
        super().__init__()
        self.slopes = alibi_slopes(n_head)

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        slopes = torch.tensor(self.slopes, dtype=torch.float32, device=q_positions.device)
        distance = (k_positions[:, None, :] - q_positions[:, :, None]).float()  # (B, Tq, Tk), <= 0 where visible
        return slopes[:, None, None] * distance[:, None]  # (B, nh, Tq, Tk)


@hookimpl
def register_positions(register):
    register("none", NoPosition)
    register("learned", LearnedPosition)
    register("sinusoidal", SinusoidalPosition)
    register("rope", RoPE)
    register("alibi", ALiBi)

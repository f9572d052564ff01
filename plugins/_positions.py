"""Position encodings.

- none: no position information (NoPE; causal attention still orders tokens).
- learned: a trained table of absolute positions (GPT-2, Radford et al., 2019).
- sinusoidal: the fixed sin/cos table of Vaswani et al. (2017), sin at even and cos at odd features.
- rope: rotary embeddings (Su et al., 2021) in HF Llama's rotate-half convention, base ``theta``, on
  a ``fraction`` of each head (partial rotary); rope_linear, rope_dynamic, rope_llama3 and rope_yarn
  scale its frequencies for longer contexts exactly as transformers' rope types of those names.
- alibi: linear distance biases with the head slopes of Press et al. (2022), ``get_slopes`` in
  github.com/ofirpress/attention_with_linear_biases.

Tables and frequencies are computed from constructor arguments on the positions' device, never
stored as buffers, so a model built on the meta device and loaded later needs no re-initialization.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gptzoo.interfaces import Position


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
    """q and k rotated by precomputed cos/sin (B, T, rotary_dim), HF Llama's rotate-half convention;
    when rotary_dim < hs only the first rotary_dim features of each head turn (partial rotary, GPT-NeoX)."""

    def __init__(self, cos: Tensor, sin: Tensor, *, in_float32: bool = False) -> None:
        self.cos, self.sin = cos[:, None], sin[:, None]  # (B, 1, T, rotary_dim): the same for every head
        self.in_float32 = in_float32

    def apply(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.in_float32:  # rotate in float32 (the tables' dtype), then round back: OLMo 2's numerics
            return self._turn(q, self.cos, self.sin).to(q.dtype), self._turn(k, self.cos, self.sin).to(k.dtype)
        cos, sin = self.cos.to(q.dtype), self.sin.to(q.dtype)
        return self._turn(q, cos, sin), self._turn(k, cos, sin)

    @staticmethod
    def _turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        n = cos.shape[-1]
        if n == x.shape[-1]:
            return x * cos + _rotate_half(x) * sin
        turned, kept = x[..., :n], x[..., n:]
        return torch.cat((turned * cos + _rotate_half(turned) * sin, kept), dim=-1)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _positive(name: str, value: float) -> list[str]:
    return [] if math.isfinite(value) and value > 0 else [f"{name} must be a positive number, got {value}"]


MAX_FACTOR = 1e4
"""The widest RoPE scaling factor either way: published models use 2 to 64, and 1e-300 or 1e300 turns
float32 frequencies into infinities or zeros."""


def _factor(value: float) -> list[str]:
    if math.isfinite(value) and 1 / MAX_FACTOR <= value <= MAX_FACTOR:
        return []
    return [f"factor must be a number between {1 / MAX_FACTOR:g} and {MAX_FACTOR:g}, got {value}"]


class RoPE(Position):
    """Rotary position embeddings (Su et al., 2021), rotate-half convention as in HF Llama.

    ``fraction`` of each head's features rotate (the first ones; GPT-NeoX's rotary_pct, Phi's
    partial_rotary_factor), the rest pass through. ``rotate_in_float32`` rotates q and k in float32
    and rounds the result back (OLMo 2); by default the tables are rounded to q's dtype first (Llama).
    Subclasses change the frequencies (``inv_freq``): the scaled variants of transformers'
    modeling_rope_utils.
    """

    examples = [{"fraction": 0.5}, {"rotate_in_float32": True}]

    def __init__(
        self,
        *,
        n_embd: int,
        n_head: int,
        head_dim: int,
        context_length: int,
        theta: float = 10000.0,
        fraction: float = 1.0,
        rotate_in_float32: bool = False,
    ) -> None:
        super().__init__()
        self.head_dim, self.theta, self.fraction = head_dim, theta, fraction
        self.rotate_in_float32 = rotate_in_float32
        self.dim = int(head_dim * fraction)  # the rotary features, as transformers rounds them
        self.context_length = context_length

    @staticmethod
    def check(*, head_dim: int, theta: float = 10000.0, fraction: float = 1.0, **_: object) -> list[str]:
        problems = []
        if not 0 < fraction <= 1:
            problems.append(f"fraction must be in (0, 1], got {fraction}")
        elif fraction == 1 and head_dim % 2:
            problems.append(f"rope needs an even head_dim, got {head_dim}")
        elif int(head_dim * fraction) % 2 or int(head_dim * fraction) == 0:
            problems.append(
                f"rope needs an even number of rotary features >= 2, got head_dim {head_dim} x fraction {fraction} "
                f"= {int(head_dim * fraction)}"
            )
        return problems + _positive("rope theta", theta)

    def base_inv_freq(self, device: torch.device, theta: float | None = None) -> Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float()
        return 1.0 / ((self.theta if theta is None else theta) ** (exponents / self.dim))  # (dim/2,)

    def inv_freq(self, positions: Tensor) -> tuple[Tensor, float]:
        """The frequencies (dim/2,) for these positions and the factor cos and sin are scaled by."""
        return self.base_inv_freq(positions.device), 1.0

    def rotary(self, positions: Tensor) -> RotateHalf:
        inv_freq, factor = self.inv_freq(positions)
        freqs = positions.float()[..., None] * inv_freq  # (B, T, dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, dim)
        cos, sin = (emb.cos(), emb.sin()) if factor == 1.0 else (emb.cos() * factor, emb.sin() * factor)
        return RotateHalf(cos, sin, in_float32=self.rotate_in_float32)


class LinearRoPE(RoPE):
    """RoPE with positions interpolated by ``factor`` (Chen et al., 2023): frequencies / factor."""

    examples = [{"factor": 4.0}]

    def __init__(
        self,
        *,
        n_embd: int,
        n_head: int,
        head_dim: int,
        context_length: int,
        theta: float = 10000.0,
        fraction: float = 1.0,
        rotate_in_float32: bool = False,
        factor: float = 1.0,
    ) -> None:
        super().__init__(
            n_embd=n_embd,
            n_head=n_head,
            head_dim=head_dim,
            context_length=context_length,
            theta=theta,
            fraction=fraction,
            rotate_in_float32=rotate_in_float32,
        )
        self.factor = factor

    @staticmethod
    def check(*, factor: float = 1.0, **params: object) -> list[str]:
        return RoPE.check(**params) + _factor(factor)

    def inv_freq(self, positions: Tensor) -> tuple[Tensor, float]:
        return self.base_inv_freq(positions.device) / self.factor, 1.0


class DynamicRoPE(LinearRoPE):
    """Dynamic NTK RoPE: beyond context_length positions, theta grows with the longest position.

    For a pass over L positions, theta ((factor L / context_length) - (factor - 1))^(dim / (dim - 2)),
    as transformers computes it at each forward.
    """

    examples = [{"factor": 2.0}]

    @staticmethod
    def check(*, head_dim: int, fraction: float = 1.0, **params: object) -> list[str]:
        problems = LinearRoPE.check(head_dim=head_dim, fraction=fraction, **params)
        if not problems and int(head_dim * fraction) <= 2:
            problems.append("rope_dynamic needs more than 2 rotary features (its theta grows as dim / (dim - 2))")
        return problems

    def inv_freq(self, positions: Tensor) -> tuple[Tensor, float]:
        longest = positions.max() + 1 if positions.numel() else torch.tensor(0, device=positions.device)
        seq_len = torch.maximum(longest, torch.tensor(self.context_length, device=positions.device))  # as transformers
        theta = self.theta * ((self.factor * seq_len / self.context_length) - (self.factor - 1)) ** (
            self.dim / (self.dim - 2)
        )
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=positions.device).float()
        return 1.0 / (theta ** (exponents / self.dim)), 1.0


class Llama3RoPE(RoPE):
    """Llama 3.1's RoPE: long wavelengths divided by ``factor``, short ones kept, a smooth ramp between."""

    examples = [{"original_context": 16}]

    def __init__(
        self,
        *,
        n_embd: int,
        n_head: int,
        head_dim: int,
        context_length: int,
        theta: float = 500000.0,
        fraction: float = 1.0,
        rotate_in_float32: bool = False,
        factor: float = 8.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_context: int = 8192,
    ) -> None:
        super().__init__(
            n_embd=n_embd,
            n_head=n_head,
            head_dim=head_dim,
            context_length=context_length,
            theta=theta,
            fraction=fraction,
            rotate_in_float32=rotate_in_float32,
        )
        self.factor, self.low_freq_factor, self.high_freq_factor = factor, low_freq_factor, high_freq_factor
        self.original_context = original_context

    @staticmethod
    def check(
        *,
        factor: float = 8.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_context: int = 8192,
        **params: object,
    ) -> list[str]:
        problems = RoPE.check(**params) + _factor(factor) + _positive("low_freq_factor", low_freq_factor)
        if not high_freq_factor > low_freq_factor:
            problems.append(f"high_freq_factor {high_freq_factor} must be above low_freq_factor {low_freq_factor}")
        return problems + _positive("original_context", original_context)

    def inv_freq(self, positions: Tensor) -> tuple[Tensor, float]:
        inv_freq = self.base_inv_freq(positions.device)
        low_wavelen = self.original_context / self.low_freq_factor
        high_wavelen = self.original_context / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_context / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0


class YaRNRoPE(RoPE):
    """YaRN (Peng et al., 2023): RoPE frequencies interpolated by ``factor`` below a ramp, kept above it.

    The ramp runs between beta_slow and beta_fast rotations over original_context; cos and sin are
    scaled by the attention factor (0.1 ln(factor) + 1 unless given, or the mscale ratio).
    """

    examples = [{"factor": 4.0, "original_context": 16}, {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5}]

    def __init__(
        self,
        *,
        n_embd: int,
        n_head: int,
        head_dim: int,
        context_length: int,
        theta: float = 10000.0,
        fraction: float = 1.0,
        rotate_in_float32: bool = False,
        factor: float = 1.0,
        original_context: int = 4096,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float = 0.0,
        mscale_all_dim: float = 0.0,
        attention_factor: float = 0.0,
        truncate: bool = True,
    ) -> None:
        super().__init__(
            n_embd=n_embd,
            n_head=n_head,
            head_dim=head_dim,
            context_length=context_length,
            theta=theta,
            fraction=fraction,
            rotate_in_float32=rotate_in_float32,
        )
        self.factor, self.original_context = factor, original_context
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        self.mscale, self.mscale_all_dim, self.attention_factor = mscale, mscale_all_dim, attention_factor

    @staticmethod
    def check(
        *,
        factor: float = 1.0,
        original_context: int = 4096,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        **params: object,
    ) -> list[str]:
        problems = RoPE.check(**{k: v for k, v in params.items() if k in ("head_dim", "theta", "fraction")})
        theta = params.get("theta", 10000.0)
        if isinstance(theta, float) and math.isfinite(theta) and 0 < theta <= 1:
            problems.append(f"rope_yarn needs theta > 1 (its ramp divides by log(theta)), got {theta}")
        problems += _factor(factor) + _positive("original_context", original_context)
        return problems + _positive("beta_fast", beta_fast) + _positive("beta_slow", beta_slow)

    def magnitude(self) -> float:
        """The factor cos and sin are scaled by: attention_factor if given, else from the mscales."""
        if self.attention_factor:
            return self.attention_factor

        def get_mscale(scale: float, mscale: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim)
        return get_mscale(self.factor)

    def inv_freq(self, positions: Tensor) -> tuple[Tensor, float]:
        dim, theta = self.dim, self.theta

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(self.original_context / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(positions.device)
        extrapolation = 1 - ramp
        pos_freqs = theta ** (torch.arange(0, dim, 2, device=positions.device).float() / dim)
        inv_freq = (1.0 / (self.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
        return inv_freq, self.magnitude()


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

"""Normalization layers: LayerNorm (Ba et al., 2016) and RMSNorm (Zhang & Sennrich, 2019).

- rmsnorm follows HF transformers' LlamaRMSNorm: normalize in float32 (float64 stays float64), cast
  back, then scale by the weight. With ``scale_in_float32 = true`` it follows OLMo 2's Olmo2RMSNorm
  instead: the weight multiplies in float32 too, before the cast back. The two agree exactly in
  float32 and differ by a rounding in bfloat16 and float16.
- gemma_rmsnorm follows Gemma's: the weight is stored as an offset from 1 (initialized to zeros),
  and both the normalization and the scaling by (1 + weight) happen in float32 before the cast back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_eps(*, eps: float = 1e-5, **_: object) -> list[str]:
    return [] if math.isfinite(eps) and eps > 0 else [f"eps must be a positive number, got {eps}"]


class LayerNorm(nn.Module):
    """LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias (bias optional)."""

    check = staticmethod(check_eps)

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight, normalized in (at least) float32.

    ``scale_in_float32``: multiply by the weight before casting back to the input's dtype (OLMo 2),
    not after (Llama); the same in float32.
    """

    check = staticmethod(check_eps)

    def __init__(self, dim: int, *, eps: float = 1e-6, scale_in_float32: bool = False) -> None:
        super().__init__()
        self.eps, self.scale_in_float32 = eps, scale_in_float32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_float32:
            return (self.weight * h).to(x.dtype)
        return self.weight * h.to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """RMSNorm with a (1 + weight) scale, all in float32 (Gemma; the weight starts at zero)."""

    check = staticmethod(check_eps)

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.to(h.dtype))).to(x.dtype)

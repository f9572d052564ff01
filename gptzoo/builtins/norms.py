"""Normalization layers: LayerNorm (Ba et al., 2016) and RMSNorm (Zhang & Sennrich, 2019).

- rmsnorm follows HF transformers' LlamaRMSNorm: normalize in float32 (float64 stays float64), cast
  back, then scale by the weight.
- gemma_rmsnorm follows Gemma's: the weight is stored as an offset from 1 (initialized to zeros),
  and both the normalization and the scaling by (1 + weight) happen in float32 before the cast back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.hookspecs import hookimpl
from gptzoo.interfaces import TensorMap


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

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        if family != "gpt2" or self.bias is None:  # GPT-2's LayerNorms have a bias
            return None
        return [TensorMap("weight", ("weight",)), TensorMap("bias", ("bias",))]

    def hf_config(self, family: str) -> dict[str, float] | None:
        return {"layer_norm_epsilon": self.eps} if family == "gpt2" else None


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight, computed in (at least) float32."""

    check = staticmethod(check_eps)

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [TensorMap("weight", ("weight",))] if family == "llama" else None

    def hf_config(self, family: str) -> dict[str, float] | None:
        return {"rms_norm_eps": self.eps} if family == "llama" else None


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

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [TensorMap("weight", ("weight",))] if family == "llama" else None

    def hf_config(self, family: str) -> dict[str, float] | None:
        return {"rms_norm_eps": self.eps, "rms_norm_offset": 1.0} if family == "llama" else None


@hookimpl
def register_norms(register):
    register("layernorm", LayerNorm)
    register("rmsnorm", RMSNorm)
    register("gemma_rmsnorm", GemmaRMSNorm)

"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``).

Each factory takes no parameters, so a recipe cannot reach into torch's modules' options.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GELU(nn.GELU):
    """GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016)."""

    def __init__(self) -> None:
        super().__init__()


class GELUTanh(nn.GELU):
    """GELU, tanh approximation (GPT-2; HF gelu_new)."""

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


class ReLU(nn.ReLU):
    """ReLU: max(x, 0)."""

    def __init__(self) -> None:
        super().__init__()


class SiLU(nn.SiLU):
    """SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."""

    def __init__(self) -> None:
        super().__init__()


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), GELU's sigmoid approximation (HF quick_gelu; the gate of gpt-oss's SwiGLU)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)

"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``).

Each factory takes no parameters, so a recipe cannot reach into torch's modules' options.
"""

from __future__ import annotations

from torch import nn

from gptzoo.interfaces import Buffer, DecodePlan


class GELU(nn.GELU):
    """GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016)."""

    def __init__(self) -> None:
        super().__init__()

    def decode_ops(self, plan: DecodePlan, src: Buffer, dst: Buffer, *, gated: bool) -> None:
        plan.activate(src, dst, "gelu", gated=gated)


class GELUTanh(nn.GELU):
    """GELU, tanh approximation (GPT-2; HF gelu_new)."""

    def __init__(self) -> None:
        super().__init__(approximate="tanh")

    def decode_ops(self, plan: DecodePlan, src: Buffer, dst: Buffer, *, gated: bool) -> None:
        plan.activate(src, dst, "gelu_tanh", gated=gated)


class ReLU(nn.ReLU):
    """ReLU: max(x, 0)."""

    def __init__(self) -> None:
        super().__init__()

    def decode_ops(self, plan: DecodePlan, src: Buffer, dst: Buffer, *, gated: bool) -> None:
        plan.activate(src, dst, "relu", gated=gated)


class SiLU(nn.SiLU):
    """SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."""

    def __init__(self) -> None:
        super().__init__()

    def decode_ops(self, plan: DecodePlan, src: Buffer, dst: Buffer, *, gated: bool) -> None:
        plan.activate(src, dst, "silu", gated=gated)

"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``).

Each factory takes no parameters, so a recipe cannot reach into torch's modules' options.
"""

from __future__ import annotations

from torch import nn

from gptzoo.hookspecs import hookimpl


def gelu() -> nn.Module:
    """GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016)."""
    return nn.GELU()


def gelu_tanh() -> nn.Module:
    """GELU, tanh approximation (GPT-2; HF gelu_new)."""
    return nn.GELU(approximate="tanh")


def relu() -> nn.Module:
    """ReLU: max(x, 0)."""
    return nn.ReLU()


def silu() -> nn.Module:
    """SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."""
    return nn.SiLU()


@hookimpl
def register_activations(register):
    register("gelu", gelu)
    register("gelu_tanh", gelu_tanh)
    register("relu", relu)
    register("silu", silu)

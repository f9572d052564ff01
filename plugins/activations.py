"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``)."""

from __future__ import annotations

from functools import partial

from torch import nn

from gptzoo import hookimpl


@hookimpl
def register_activations(register):
    register("gelu", nn.GELU, doc="GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016)")
    register("gelu_tanh", partial(nn.GELU, approximate="tanh"), doc="GELU, tanh approximation (GPT-2, HF gelu_new)")
    register("relu", nn.ReLU, doc="ReLU: max(x, 0)")
    register("silu", nn.SiLU, doc="SiLU / swish: x * sigmoid(x) (SwiGLU's gate in Llama)")

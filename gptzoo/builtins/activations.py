"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``).

Each factory takes no parameters, so a recipe cannot reach into torch's modules' options. Each
activation owns the one config.json field that names it in a Hugging Face family (GPT-2's
``activation_function``, Llama's ``hidden_act``), with HF's ACT2FN name for the same function.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from gptzoo.hookspecs import hookimpl
from gptzoo.interfaces import TensorMap

HF_FIELDS = {"gpt2": "activation_function", "llama": "hidden_act"}
"""family -> the config.json field that names the activation."""


class HFNamed:
    """An activation that Hugging Face names: ``hf_names`` (family -> ACT2FN name)."""

    hf_names: ClassVar[dict[str, str]] = {}

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [] if family in self.hf_names else None  # no tensors of its own

    def hf_config(self, family: str) -> dict[str, str] | None:
        return {HF_FIELDS[family]: self.hf_names[family]} if family in self.hf_names else None


class GELU(HFNamed, nn.GELU):
    """GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016)."""

    hf_names: ClassVar[dict[str, str]] = {"gpt2": "gelu", "llama": "gelu"}

    def __init__(self) -> None:
        super().__init__()


class GELUTanh(HFNamed, nn.GELU):
    """GELU, tanh approximation (GPT-2; HF gelu_new)."""

    hf_names: ClassVar[dict[str, str]] = {"gpt2": "gelu_new", "llama": "gelu_pytorch_tanh"}

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


class ReLU(HFNamed, nn.ReLU):
    """ReLU: max(x, 0)."""

    hf_names: ClassVar[dict[str, str]] = {"gpt2": "relu", "llama": "relu"}

    def __init__(self) -> None:
        super().__init__()


class SiLU(HFNamed, nn.SiLU):
    """SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."""

    hf_names: ClassVar[dict[str, str]] = {"gpt2": "silu", "llama": "silu"}

    def __init__(self) -> None:
        super().__init__()


@hookimpl
def register_activations(register):
    register("gelu", GELU)
    register("gelu_tanh", GELUTanh)
    register("relu", ReLU)
    register("silu", SiLU)

"""Elementwise activations. GPT-2 uses the tanh approximation of GELU (HF's ``gelu_new``).

Each factory takes no parameters, so a recipe cannot reach into torch's modules' options. Each
activation owns the one config.json field that names it in a Hugging Face family (GPT-2's
``activation_function``, ``hidden_act`` in Llama, GPT-NeoX and Phi-3), with HF's ACT2FN name for the
same function.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from gptzoo.interfaces import TensorMap

HF_FIELDS = {"gpt2": "activation_function", "llama": "hidden_act", "gpt_neox": "hidden_act", "phi3": "hidden_act"}
"""layout -> the config.json field that names the activation."""
NAMED_AS = {"gpt_neox": "llama", "phi3": "llama"}
"""Layouts that name activations as another does (``hf_names`` has the names of "gpt2" and "llama")."""


class HFNamed:
    """An activation that Hugging Face names: ``hf_names`` (layout -> ACT2FN name; the layouts in
    NAMED_AS use the names of the one they point to)."""

    hf_names: ClassVar[dict[str, str]] = {}

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        return [] if NAMED_AS.get(family, family) in self.hf_names else None  # no tensors of its own

    def hf_config(self, family: str) -> dict[str, str] | None:
        name = self.hf_names.get(NAMED_AS.get(family, family))
        return {HF_FIELDS[family]: name} if name is not None else None


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

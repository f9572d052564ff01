"""The built-in activations: GELU, its tanh and sigmoid approximations, ReLU and SiLU (their code:
plugins/_activations.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when an activation is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_activations(register):
    register("gelu", "gptzoo_plugins._activations:GELU", doc="GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016).")
    register("gelu_tanh", "gptzoo_plugins._activations:GELUTanh", doc="GELU, tanh approximation (GPT-2; HF gelu_new).")
    register("relu", "gptzoo_plugins._activations:ReLU", doc="ReLU: max(x, 0).")
    register(
        "silu", "gptzoo_plugins._activations:SiLU", doc="SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."
    )
    register(
        "quick_gelu",
        "gptzoo_plugins._activations:QuickGELU",
        doc="x * sigmoid(1.702 x), GELU's sigmoid approximation (HF quick_gelu; the gate of gpt-oss's SwiGLU).",
    )

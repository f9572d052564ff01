"""The built-in activations: GELU, its tanh approximation, ReLU and SiLU (their code:
gptzoo/builtins/_activations.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when an activation is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_activations(register):
    register("gelu", "gptzoo.builtins._activations:GELU", doc="GELU, exact: x * Phi(x) (Hendrycks & Gimpel, 2016).")
    register("gelu_tanh", "gptzoo.builtins._activations:GELUTanh", doc="GELU, tanh approximation (GPT-2; HF gelu_new).")
    register("relu", "gptzoo.builtins._activations:ReLU", doc="ReLU: max(x, 0).")
    register(
        "silu", "gptzoo.builtins._activations:SiLU", doc="SiLU / swish: x * sigmoid(x) (the gate of SwiGLU in Llama)."
    )

"""The built-in norms: LayerNorm, RMSNorm and Gemma's RMSNorm (their code: plugins/_norms.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when a norm is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_norms(register):
    register(
        "layernorm",
        "gptzoo_plugins._norms:LayerNorm",
        doc="LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias (bias optional).",
    )
    register(
        "rmsnorm",
        "gptzoo_plugins._norms:RMSNorm",
        doc="RMSNorm: x / sqrt(mean(x^2) + eps) * weight, normalized in (at least) float32.",
    )
    register(
        "gemma_rmsnorm",
        "gptzoo_plugins._norms:GemmaRMSNorm",
        doc="RMSNorm with a (1 + weight) scale, all in float32 (Gemma; the weight starts at zero).",
    )

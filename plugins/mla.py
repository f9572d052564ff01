"""The built-in multi-head latent attention (its code: plugins/_mla.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch, which load when the attention is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "mla",
        "gptzoo_plugins._mla:LatentAttention",
        doc="Multi-head latent attention: keys and values expanded from a cached per-token latent (DeepSeek-V2/V3).",
    )

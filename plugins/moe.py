"""The built-in mixture of experts (its code: plugins/_moe.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch, which load when the mlp is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_mlps(register):
    register(
        "moe",
        "gptzoo_plugins._moe:MixtureOfExperts",
        doc="Mixture of experts: a router sends each token to top_k of its experts, beside optional shared ones.",
    )

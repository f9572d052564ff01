"""The built-in MLPs: dense and gated (their code: plugins/_mlps.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when an mlp is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_mlps(register):
    register("dense", "gptzoo_plugins._mlps:DenseMLP", doc="Dense MLP: c_proj(act(c_fc(x))), d -> d_ff -> d.")
    register(
        "gated",
        "gptzoo_plugins._mlps:GatedMLP",
        doc="Gated MLP: c_proj(act(x W) * (x V)); SwiGLU with silu, GeGLU with gelu.",
    )

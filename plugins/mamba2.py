"""The built-in Mamba-2, the state space token mixer of Granite 4.0-H and Falcon-H1 in an attention's place (its
code: plugins/_mamba2.py, state space duality's two forms plugins/_ssd.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "mamba2",
        "gptzoo_plugins._mamba2:Mamba2",
        doc="Mamba-2 (Granite 4.0-H, Falcon-H1): a selective state space scan, a constant-size state per sequence.",
    )

"""The built-in Kimi delta attention, Kimi Linear's linear-attention token mixer in an attention's place (its code:
plugins/_kda.py, the per-channel delta rule's two forms in plugins/_delta_rule.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "kda",
        "gptzoo_plugins._kda:KimiDeltaAttention",
        doc="Kimi delta attention (Kimi Linear): the gated delta rule with a decay per key channel, a constant-size "
        "state.",
    )

"""The built-in gated DeltaNet, the linear-attention token mixer of Qwen3-Next, Qwen3.5 and OLMo Hybrid in an
attention's place (its code: plugins/_gated_deltanet.py, the delta rule's two forms plugins/_delta_rule.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "gated_deltanet",
        "gptzoo_plugins._gated_deltanet:GatedDeltaNet",
        doc="Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo Hybrid): the gated delta rule, a constant-size state per "
        "sequence.",
    )

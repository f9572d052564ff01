"""The built-in gated short convolution, LFM2's token mixer in an attention's place (its code:
plugins/_short_conv.py).

A plugin like any other, which registers it by reference (gptzoo.registry): listing it imports neither
that module nor torch.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "short_conv",
        "gptzoo_plugins._short_conv:ShortConv",
        doc="Gated short convolution (LFM2): c_proj(C * conv(B * x)), a causal depthwise convolution of a few taps.",
    )

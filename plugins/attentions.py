"""The built-in attentions: causal, eager and sliding-window (their code: plugins/_attentions.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when an attention is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_attentions(register):
    register(
        "causal",
        "gptzoo_plugins._attentions:CausalSelfAttention",
        doc="Causal self-attention through scaled_dot_product_attention",
    )
    register(
        "eager",
        "gptzoo_plugins._attentions:EagerSelfAttention",
        doc="Causal self-attention computed explicitly: softmax(QK^T/sqrt(d_k) + M)V.",
    )
    register(
        "sliding_window",
        "gptzoo_plugins._attentions:SlidingWindowAttention",
        doc="Sliding-window causal self-attention: each query sees its last ``window`` keys; the cache keeps only "
        "those.",
    )

"""The built-in sampler-chain steps: greedy, temperature, top-k, top-p, min-p and the repetition
penalty (their code: plugins/_samplers.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when a sampler is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_samplers(register):
    register(
        "greedy", "gptzoo_plugins._samplers:Greedy", doc="Pick the most likely token (argmax; the first one on ties)."
    )
    register(
        "temperature",
        "gptzoo_plugins._samplers:Temperature",
        doc="Divide logits by temperature (> 0): below 1 sharpens, above 1 flattens.",
    )
    register(
        "top_k", "gptzoo_plugins._samplers:TopK", doc="Keep the k most likely tokens (and any tied with the k-th)."
    )
    register(
        "top_p",
        "gptzoo_plugins._samplers:TopP",
        doc="Keep the smallest set of most likely tokens whose probability mass reaches p (nucleus).",
    )
    register(
        "min_p",
        "gptzoo_plugins._samplers:MinP",
        doc="Drop tokens whose probability is below p times that of the most likely token.",
    )
    register(
        "repetition_penalty",
        "gptzoo_plugins._samplers:RepetitionPenalty",
        doc="Penalize tokens already present: positive logits divided by penalty, negative multiplied (CTRL).",
    )

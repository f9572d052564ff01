"""The built-in position encodings: none, learned, sinusoidal, RoPE and its scalings, ALiBi
(their code: plugins/_positions.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when a position is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_positions(register):
    register("none", "gptzoo_plugins._positions:NoPosition", doc="No position encoding (NoPE).")
    register(
        "learned",
        "gptzoo_plugins._positions:LearnedPosition",
        doc="Learned absolute position embeddings (GPT-2); limited to context_length positions.",
    )
    register(
        "sinusoidal",
        "gptzoo_plugins._positions:SinusoidalPosition",
        doc="Fixed sinusoidal position embeddings (Vaswani et al., 2017).",
    )
    register(
        "rope",
        "gptzoo_plugins._positions:RoPE",
        doc="Rotary position embeddings (Su et al., 2021), rotate-half convention as in HF Llama.",
    )
    register(
        "rope_linear",
        "gptzoo_plugins._positions:LinearRoPE",
        doc="RoPE with positions interpolated by ``factor`` (Chen et al., 2023): frequencies / factor.",
    )
    register(
        "rope_dynamic",
        "gptzoo_plugins._positions:DynamicRoPE",
        doc="Dynamic NTK RoPE: beyond context_length positions, theta grows with the longest position.",
    )
    register(
        "rope_llama3",
        "gptzoo_plugins._positions:Llama3RoPE",
        doc="Llama 3.1's RoPE: long wavelengths divided by ``factor``, short ones kept, a smooth ramp between.",
    )
    register(
        "rope_yarn",
        "gptzoo_plugins._positions:YaRNRoPE",
        doc="YaRN (Peng et al., 2023): RoPE frequencies interpolated by ``factor`` below a ramp, kept above it.",
    )
    register(
        "alibi",
        "gptzoo_plugins._positions:ALiBi",
        doc="Attention with linear biases (Press et al., 2022): score += slope_h * (j - i) for key j <= query i.",
    )

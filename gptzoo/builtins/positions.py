"""The built-in position encodings: none, learned, sinusoidal, RoPE and its scalings, ALiBi
(their code: gptzoo/builtins/_positions.py).

A plugin like any other, which registers each by reference (gptzoo.registry): listing them imports
neither that module nor torch, which load when a position is first needed.
"""

from gptzoo.hookspecs import hookimpl


@hookimpl
def register_positions(register):
    register("none", "gptzoo.builtins._positions:NoPosition", doc="No position encoding (NoPE).")
    register(
        "learned",
        "gptzoo.builtins._positions:LearnedPosition",
        doc="Learned absolute position embeddings (GPT-2); limited to context_length positions.",
    )
    register(
        "sinusoidal",
        "gptzoo.builtins._positions:SinusoidalPosition",
        doc="Fixed sinusoidal position embeddings (Vaswani et al., 2017).",
    )
    register(
        "rope",
        "gptzoo.builtins._positions:RoPE",
        doc="Rotary position embeddings (Su et al., 2021), rotate-half convention as in HF Llama.",
    )
    register(
        "rope_linear",
        "gptzoo.builtins._positions:LinearRoPE",
        doc="RoPE with positions interpolated by ``factor`` (Chen et al., 2023): frequencies / factor.",
    )
    register(
        "rope_dynamic",
        "gptzoo.builtins._positions:DynamicRoPE",
        doc="Dynamic NTK RoPE: beyond context_length positions, theta grows with the longest position.",
    )
    register(
        "rope_llama3",
        "gptzoo.builtins._positions:Llama3RoPE",
        doc="Llama 3.1's RoPE: long wavelengths divided by ``factor``, short ones kept, a smooth ramp between.",
    )
    register(
        "rope_yarn",
        "gptzoo.builtins._positions:YaRNRoPE",
        doc="YaRN (Peng et al., 2023): RoPE frequencies interpolated by ``factor`` below a ramp, kept above it.",
    )
    register(
        "alibi",
        "gptzoo.builtins._positions:ALiBi",
        doc="Attention with linear biases (Press et al., 2022): score += slope_h * (j - i) for key j <= query i.",
    )

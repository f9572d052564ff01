"""What Python and the native kernels share, written once: the codes and the operation record.

The dtype codes, the operation codes of step.c, the modes of its operations, its error codes and
the layout of one operation (``op_t``) are defined here; :func:`header` writes them as C
(``ops_generated.h``, which kernels.h and step.c include), and the library is compiled with that
header next to its sources (gptzoo.inference.native), so that the two sides cannot disagree.
Nothing here imports torch.
"""

from __future__ import annotations

import ctypes


def _codes(*names: str) -> dict[str, int]:
    return {name: code for code, name in enumerate(names)}


DTYPES = _codes("f32", "bf16", "i8", "q4")
"""The kernels' dtypes: float32, bfloat16 (activations and weights), int8 and 4-bit blocks (weights)."""
OPS = _codes(
    "embed",
    "rmsnorm",
    "layernorm",
    "linear",
    "add",
    "rope",
    "attend",
    "activate",
    "softcap",
    "copy",
    "clamp",
    "sigmoid_scale",
    "route",
    "mixture",
    "slice_heads",
    "heads_linear",
    "latent_attend",
    "scale",
)
"""Operation name -> step.c's code."""
RMS_MODES = _codes("plain", "scale_in_float32", "offset")
"""How an RMSNorm applies its weight: after rounding (Llama), before (OLMo 2), as 1 + w (Gemma)."""
ACTIVATIONS = _codes("gelu", "gelu_tanh", "relu", "silu", "quick_gelu")
"""The activations step.c computes."""
ATTEND_MODES = _codes("explicit", "fused")
"""How the eager forward computes attention scores: step by step, or in one kernel."""
SCORINGS = _codes("softmax", "sigmoid", "topk_softmax")
"""How a router scores the experts (gptzoo_plugins._moe's module docstring)."""
GROUP_SCORES = _codes("max", "top2")
"""How a router scores a group of experts for group-limited selection."""
ERRORS = {
    "token": (-2, "a token id outside the embedding table"),
    "memory": (-3, "out of memory"),
    "cache": (-4, "more keys than the cache holds"),
    "unknown": (-5, "an operation code the library lacks"),
}
"""What decode_step returns when an operation fails: name -> (code, meaning)."""

LENGTHS = {"NP": 8, "NN": 12, "NF": 4}
"""How many pointers, sizes and float parameters one operation has."""
FIELDS = (("code", "int", None), ("kind", "int", None), ("wkind", "int", None), ("mode", "int", None))
FIELDS += (("p", "void *", "NP"), ("n", "long", "NN"), ("f", "float", "NF"))
"""One operation's fields: (name, C type, the name of its array length in LENGTHS, or None)."""
_CTYPES = {"int": ctypes.c_int, "void *": ctypes.c_void_p, "long": ctypes.c_long, "float": ctypes.c_float}


class Op(ctypes.Structure):
    """One operation of a plan, as step.c's ``op_t``: its code, the activations' dtype (kind), a
    weight's (wkind), a mode; pointers p, sizes n and parameters f, whose meaning per code step.c
    writes at each case."""

    _fields_ = [
        (name, _CTYPES[ctype] * LENGTHS[length] if length else _CTYPES[ctype]) for name, ctype, length in FIELDS
    ]


def _enum(prefix: str, codes: dict[str, int]) -> str:
    return "enum { " + ", ".join(f"{prefix}{name.upper()} = {code}" for name, code in codes.items()) + " };\n"


def header() -> str:
    """``ops_generated.h``: the definitions above as C."""
    fields = "".join(f"    {ctype} {name}{f'[{length}]' if length else ''};\n" for name, ctype, length in FIELDS)
    errors = "".join(f"#define ERR_{name.upper()} ({code}) /* {text} */\n" for name, (code, text) in ERRORS.items())
    return (
        "/* Generated from gptzoo/inference/native/abi.py when the library is built: edit that file. */\n"
        "#ifndef GPTZOO_OPS_GENERATED_H\n#define GPTZOO_OPS_GENERATED_H\n\n"
        + _enum("", DTYPES)
        + _enum("OP_", OPS)
        + _enum("RMS_", RMS_MODES)
        + _enum("ACT_", ACTIVATIONS)
        + _enum("ATTEND_", ATTEND_MODES)
        + _enum("SCORE_", SCORINGS)
        + _enum("GROUP_", GROUP_SCORES)
        + "\n"
        + "".join(f"#define {name} {value}\n" for name, value in LENGTHS.items())
        + "\ntypedef struct {\n"
        + fields
        + "} op_t;\n\n"
        + errors
        + "\n#endif\n"
    )

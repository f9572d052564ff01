"""Weight-only int8 and 4-bit weights for CPU decoding (``--dtype int8``, ``--dtype int4``).

Every plain ``nn.Linear`` of the model (the LM head included, tied or not) becomes an
:class:`Int8Linear`: its weight rounded to int8 with one float32 scale per output row (symmetric,
scale = max |w| / 127 over the row), everything else (embeddings, norms, the KV cache, the
activations) stays in the model's dtype. Per token a decoder then reads a byte per weight, half of
bfloat16. The native kernels compute few-row products straight from the int8 weights (where the
CPU has AVX512-VNNI, multiplying them with the input rounded to int16 in blocks of 64, each block
with a float32 scale: 15 bits per block, finer than bfloat16's 8 per element, at a third of the
instructions of widening every weight to float32); longer inputs (a prefill) dequantize a slice of
rows at a time and use torch's matrix-matrix kernels.

``--dtype int4`` makes every plain nn.Linear an :class:`Int4Linear` instead: llama.cpp's Q4_0,
blocks of 32 weights along the input, each 32 4-bit codes and a float16 scale (4.5 bits a weight,
9/32 of bfloat16's bytes), rounded exactly as llama.cpp's reference quantizer rounds them, so that a
Q4_0 GGUF's blocks and these are the same numbers. A linear whose input width is not a multiple of
32 stays in float (said when the model loads).

A component decides which of its linears may be quantized with a class attribute ``int8``
(contract 4, gptzoo.hookspecs), which both precisions obey: True (the default) lets every nn.Linear
inside it be, False none (they stay in the model's dtype), a tuple of names (``("c_fc", "c_proj")``,
paths inside the component) those only. A linear is quantized unless a module around it keeps it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.errors import GptzooError
from gptzoo.inference.matvec import Q4_BLOCK, native_linear
from gptzoo.plugin_code import linear_paths

SLICE_ROWS = 4096
"""Rows of weight dequantized at a time for a long input (bounds the temporary memory)."""


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is held quantized: ``qweight`` and its ``scale`` (as a subclass
    lays them out), a bias in the input's dtype. Few-row inputs go through the native kernels;
    longer ones (a prefill) through torch, SLICE_ROWS dequantized rows at a time."""

    uses_native_kernels = True
    """Few-row inputs go through gptzoo.inference.matvec's kernels (which native_decoding tunes)."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None, in_features: int) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = qweight.shape[0], in_features

    def dequantized(self, start: int, stop: int) -> Tensor:
        """Rows start..stop-1 of the weight as float32."""
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        """The weight as float32 (out, in), dequantized on each read: for a component that reads its
        linear's weight itself (an MoE slicing it per expert, an attention absorbing a projection into
        another); slower than calling the linear, which never reads it."""
        return self.dequantized(0, self.out_features)

    def forward(self, x: Tensor) -> Tensor:
        y = native_linear(x, self.qweight, self.bias, self.scale)
        if y is not None:
            return y
        parts = [
            F.linear(x, self.dequantized(start, min(start + SLICE_ROWS, self.out_features)).to(x.dtype))
            for start in range(0, self.out_features, SLICE_ROWS)
        ]
        y = torch.cat(parts, dim=-1)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Linear(QuantizedLinear):
    """y = (x @ q^T) * scale + b, q int8 (out, in), scale float32 (out,), b in the input's dtype."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
        qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(qweight, scale, bias, linear.in_features)

    def dequantized(self, start: int, stop: int) -> Tensor:
        return self.qweight[start:stop].float() * self.scale[start:stop, None]


class Int4Linear(QuantizedLinear):
    """y = x @ W^T + b, W in llama.cpp's Q4_0 blocks along each row: weight = (q - 8) * d, q a 4-bit
    code, d the float16 scale of its block of Q4_BLOCK. ``qweight`` (out, in / 2) uint8 holds, for
    block k of a row, bytes j < 16 with the codes of weights 32k + j (low 4 bits) and 32k + 16 + j
    (high); ``scale`` (out, in / 32) float16; b in the input's dtype."""

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        """Whether the linear's rows split into whole blocks."""
        return linear.in_features % Q4_BLOCK == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        """llama.cpp's quantize_row_q4_0_ref: per block, d = (the weight of largest magnitude, the first
        of equals) / -8 and q = min(15, floor(w / d + 8.5)), d kept in float16."""
        w = linear.weight.detach().float()
        out, width = w.shape
        blocks = w.reshape(out, width // Q4_BLOCK, Q4_BLOCK)
        top = blocks.gather(2, blocks.abs().argmax(dim=2, keepdim=True))
        d = top / -8
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.floor(blocks * inverse + 8.5).clamp_(max=15).to(torch.uint8)
        half = Q4_BLOCK // 2
        packed = (q[..., :half] | (q[..., half:] << 4)).reshape(out, width // 2).contiguous()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(packed, d.squeeze(2).to(torch.float16), bias, width)

    def codes(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The 4-bit codes (0..15) of rows start..stop-1."""
        stop = self.out_features if stop is None else stop
        blocks = self.qweight[start:stop].view(stop - start, -1, Q4_BLOCK // 2)
        return torch.cat([blocks & 15, blocks >> 4], dim=2).view(stop - start, self.in_features)

    def dequantized(self, start: int, stop: int) -> Tensor:
        q = self.codes(start, stop).float().view(stop - start, -1, Q4_BLOCK) - 8
        return (q * self.scale[start:stop, :, None].float()).view(stop - start, self.in_features)


QUANTIZED = {"int8": Int8Linear, "int4": Int4Linear}
"""Weight-only precision -> the module each plain nn.Linear becomes."""


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def kept_float(model: nn.Module) -> list[str]:
    """The paths of the linears of ``model`` that a module around them keeps in float (its ``int8``)."""
    kept: set[str] = set()
    for prefix, module in model.named_modules():
        declared = getattr(type(module), "int8", True)
        if declared is True:
            continue
        allowed = set() if declared is False else set(declared)
        kept.update(join(prefix, path) for path in linear_paths(module) if path not in allowed)
    return [path for path in linear_paths(model) if path in kept]


def unfit(model: nn.Module, precision: str) -> list[str]:
    """The paths of the plain linears of ``model`` whose shape ``precision`` cannot hold (int4: an input
    width that is not a multiple of its blocks), which stay in float."""
    module = QUANTIZED[precision]
    fits = getattr(module, "fits", None)
    if fits is None:
        return []
    return [path for path in linear_paths(model) if not fits(model.get_submodule(path))]


def quantize(model: nn.Module, precision: str) -> int:
    """Replace every plain nn.Linear of ``model`` (in place) by the module of ``precision`` (QUANTIZED),
    but those its components keep in float (:func:`kept_float`) and those it cannot hold
    (:func:`unfit`); return how many were replaced.

    Raises:
        GptzooError: a Linear's weights hold NaN or infinity (rounding would hide them), before
            anything is replaced.
    """
    kept = set(kept_float(model)) | set(unfit(model, precision))
    linears = [
        (join(prefix, name), parent, name, child)
        for prefix, parent in model.named_modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and join(prefix, name) not in kept
    ]
    broken = [path for path, *_, linear in linears if not linear.weight.detach().isfinite().all()]
    if broken:
        raise GptzooError(
            f"the weights of {', '.join(broken[:3])}{' and more' if len(broken) > 3 else ''} hold NaN or infinity "
            f"(e.g. from a diverged training run), which {precision} would round away; check the weights"
        )
    for _, parent, name, linear in linears:
        setattr(parent, name, QUANTIZED[precision].from_linear(linear))
    return len(linears)

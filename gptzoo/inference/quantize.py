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

``--dtype int4`` makes every plain nn.Linear but the output head an :class:`Int4Linear` instead:
llama.cpp's Q4_1 blocks, 32 weights along the input, each 32 4-bit codes with a float16 scale and
minimum (5 bits a weight, 5/16 of bfloat16's bytes), each block's scale and minimum searched for the
least squared error (:func:`q4_blocks`: native, SmolLM2-135M's 3.3M blocks in 0.6 s on 2 cores); the head
becomes an Int8Linear (:data:`HEADS`). A linear whose input width is not a multiple of 32 stays in float
(said when the model loads); weights beyond float16's range are refused.

A plugin says which of its component's linears may be quantized with the ``register_quantized_linears``
hook (contract 7, gptzoo.inference.hooks; rows of a gptzoo.class_table), which both precisions obey:
True (the default, without a row) lets every nn.Linear inside it be, False none (they stay in the
model's dtype), a tuple of paths inside the component (``("c_fc", "c_proj")``) those only. A linear is
quantized unless a module around it keeps it. A component of contracts 4 to 6 said so with a class
attribute ``int8``, still read, with one GptzooWarning per class.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.class_table import ClassTable, Row
from gptzoo.errors import GptzooError, GptzooWarning
from gptzoo.inference.hooks import QUANTIZED_LINEARS
from gptzoo.inference.matvec import Q4_BLOCK, kernel_threads, native_linear
from gptzoo.inference.native import library
from gptzoo.plugin_code import linear_paths
from gptzoo.registry import Provenance, Registry, class_key

SLICE_ROWS = 4096
"""Rows of weight dequantized at a time for a long input (bounds the temporary memory)."""


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is held quantized: ``qweight`` and its ``scale`` (as a subclass
    lays them out), a bias in the input's dtype. Few-row inputs go through the native kernels;
    longer ones (a prefill) through torch, SLICE_ROWS dequantized rows at a time."""

    uses_native_kernels = True
    """Few-row inputs go through gptzoo.inference.matvec's kernels (which native_decoding tunes)."""

    largest = float("inf")
    """The largest weight magnitude the format holds."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None, in_features: int) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = qweight.shape[0], in_features

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        """Whether this format can hold the linear's weight (every shape, unless a subclass says otherwise)."""
        return True

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
    """y = x @ W^T + b, W in llama.cpp's Q4_1 blocks along each row: weight = q * d + m, q a 4-bit code,
    d and m the float16 scale and minimum of its block of Q4_BLOCK. ``qweight`` (out, in / 2) uint8
    holds, for block k of a row, bytes j < 16 with the codes of weights 32k + j (low 4 bits) and
    32k + 16 + j (high); ``scale`` (out, 2, in / 32) float16 a row's scales, then its minimums; b in
    the input's dtype."""

    largest = float(torch.finfo(torch.float16).max)
    """A block's minimum is a float16."""

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        """Whether the linear's rows split into whole blocks."""
        return linear.in_features % Q4_BLOCK == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        """The blocks of :func:`q4_blocks`."""
        packed, scale = q4_blocks(linear.weight.detach().float())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(packed, scale, bias, linear.in_features)

    def codes(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The 4-bit codes (0..15) of rows start..stop-1."""
        stop = self.out_features if stop is None else stop
        blocks = self.qweight[start:stop].view(stop - start, -1, Q4_BLOCK // 2)
        return torch.cat([blocks & 15, blocks >> 4], dim=2).view(stop - start, self.in_features)

    def dequantized(self, start: int, stop: int) -> Tensor:
        q = self.codes(start, stop).float().view(stop - start, -1, Q4_BLOCK)
        scale = self.scale[start:stop].float()
        return (q * scale[:, 0, :, None] + scale[:, 1, :, None]).view(stop - start, self.in_features)


QUANTIZE_WEIGHTS = 1 << 18
"""Weights :func:`q4_blocks_reference` searches at a time (a few MB of temporaries: in the cache, not the memory)."""

RANGES = tuple(14 + 0.2 * k for k in range(11))
"""The code ranges a block's weights are tried over, besides its minimum to maximum as 15 steps."""


def q4_blocks(w: Tensor) -> tuple[Tensor, Tensor]:
    """Float32 weights (rows, in), ``in`` a multiple of Q4_BLOCK, as Int4Linear holds them: the codes packed
    two to a byte (rows, in / 2) and the float16 scales and minimums (rows, 2, in / 32), the blocks of
    :func:`q4_blocks_reference` bit for bit. The native kernel (gptzoo.inference.native, quantize.c) searches
    a block's candidates while its weights sit in registers, on every core, about 20 times faster than the
    reference's passes over the whole matrix, and far more so when another process shares the cores;
    without a C compiler the reference runs."""
    w = w.contiguous()
    rows, width = w.shape
    lib = library()
    if lib is None:
        step = max(1, QUANTIZE_WEIGHTS // width)
        parts = [q4_blocks_reference(w[start : start + step]) for start in range(0, rows, step)]
        codes = torch.cat([codes for codes, _ in parts])
        half = Q4_BLOCK // 2
        packed = (codes[..., :half] | (codes[..., half:] << 4)).reshape(rows, width // 2).contiguous()
        return packed, torch.cat([scale for _, scale in parts])
    packed = torch.empty(rows, width // 2, dtype=torch.uint8)
    scale = torch.empty(rows, 2, width // Q4_BLOCK, dtype=torch.float16)
    ranges = torch.tensor(RANGES, dtype=torch.float32)
    lib.q4_quantize(
        w.data_ptr(), rows, width, ranges.data_ptr(), len(RANGES), packed.data_ptr(), scale.data_ptr(), kernel_threads()
    )
    return packed, scale


def _total(v: Tensor) -> Tensor:
    """The sum over the last dimension (a power of two long), keeping it, in one order on every machine:
    the second half added to the first until one is left (torch's own sum's order follows the CPU's
    vector width)."""
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        v = v[..., :half] + v[..., half:]
    return v


def q4_blocks_reference(w: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of float32 weights (rows, in) as 4-bit blocks of Q4_BLOCK: the codes (rows, in / 32, 32) uint8
    and the float16 scales and minimums (rows, 2, in / 32) of the weights q * d + m nearest each block's
    (least squares). A block's candidates: its minimum to maximum in 15 steps (llama.cpp's Q4_1 reference
    quantizer), and, for each range of RANGES, the codes of that many steps from the minimum with the d
    and m that fit those codes best (as llama.cpp's K-quants search theirs); each candidate's d and m are
    rounded to float16 and the codes taken again, and the one of least squared error wins (the first of
    equal ones). Every sum is :func:`_total`'s, so quantize.c reproduces it operation for operation."""
    x = w.reshape(w.shape[0], -1, Q4_BLOCK)
    lo, hi = x.amin(2, keepdim=True), x.amax(2, keepdim=True)
    span, sums = hi - lo, _total(x)

    def rounded(d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        d, m = d.half().float(), m.half().float()
        q = torch.round((x - m) * torch.where(d != 0, 1 / d, 0)).clamp_(0, 15)
        return q, d, m, _total((q * d + m - x).square_())

    best = rounded(span / 15, lo)
    for steps in RANGES:
        q = torch.round((x - lo) * torch.where(span > 0, steps / span, 0)).clamp_(0, 15)
        sq, sqq, sqx = _total(q), _total(q.square()), _total(q * x)
        det = Q4_BLOCK * sqq - sq * sq
        d = (Q4_BLOCK * sqx - sq * sums) / torch.where(det > 0, det, 1)
        d = torch.where(det > 0, d, span / 15)
        candidate = rounded(d, torch.where(det > 0, (sums - d * sq) / Q4_BLOCK, lo))
        better = candidate[3] < best[3]
        best = tuple(torch.where(better, new, old) for new, old in zip(candidate, best, strict=True))
    q, d, m, _ = best
    return q.to(torch.uint8), torch.stack([d.squeeze(2), m.squeeze(2)], dim=1).to(torch.float16)


QUANTIZED = {"int8": Int8Linear, "int4": Int4Linear}
"""Weight-only precision -> the module each plain nn.Linear becomes."""

HEADS = {"int4": Int8Linear}
"""Weight-only precision -> the module its model's output head (``lm_head``) becomes, where not QUANTIZED's:
a head in 4-bit blocks costs more perplexity than the rest of the model in them (SmolLM2-135M +5.3%,
Gemma 3 270M +6.1%, against 0.0% and -0.6% for everything else; bench/README.md), so int4 holds its
head in int8, as llama.cpp's 4-bit mixes hold theirs in Q6_K."""

HEAD = "lm_head"
"""The path of a model's output head."""


def _some(paths: list[str]) -> str:
    return f"{', '.join(paths[:3])}{' and more' if len(paths) > 3 else ''}"


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_warned: set[type] = set()


def _int8_attribute(cls: type) -> Row | None:
    """Which linears a component of contracts 4 to 6 lets be quantized: its class attribute ``int8``."""
    if "int8" not in vars(cls):
        return None
    declared = vars(cls)["int8"]
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(
            f"{class_key(cls)} says which of its linears --dtype int8 and int4 may quantize with a class attribute "
            "int8, the form before plugin contract 7; register it from the plugin's "
            f"register_quantized_linears(register) hook instead: register({cls.__qualname__}, {declared!r}) "
            "(docs/plugins.md, 'The contracts')",
            GptzooWarning,
            stacklevel=4,
        )
    return Row(class_key(cls), "", declared, Provenance(cls.__module__, cls.__module__, "contract 4"))


def kept_float(model: nn.Module, registry: Registry | None = None) -> list[str]:
    """The paths of the linears of ``model`` that a module around them keeps in float (its row of
    register_quantized_linears, from ``registry``, default the model's own).

    Raises:
        GptzooError: a row names a path that is not one of its component's nn.Linear modules.
    """
    table = ClassTable.of(QUANTIZED_LINEARS, (), registry if registry is not None else getattr(model, "registry", None))
    kept: set[str] = set()
    for prefix, module in model.named_modules():
        match = table.find(type(module), legacy=_int8_attribute)
        if match is None or match.row.value is True:
            continue
        linears = linear_paths(module)
        allowed = set() if match.row.value is False else set(match.row.value)
        unknown = sorted(allowed - set(linears))
        if unknown:
            raise GptzooError(
                f"{match.row.provenance} registered the quantized linears of {match.row.key} as {match.row.value!r}, "
                f"but {unknown[0]!r} is not one of its nn.Linear modules ({', '.join(linears) or 'it has none'}); "
                "fix the plugin"
            )
        kept.update(join(prefix, path) for path in linears if path not in allowed)
    return [path for path in linear_paths(model) if path in kept]


def module_for(precision: str, path: str) -> type[QuantizedLinear]:
    """The module the linear at ``path`` becomes in ``precision`` (HEADS for the head, else QUANTIZED)."""
    return HEADS.get(precision, QUANTIZED[precision]) if path == HEAD else QUANTIZED[precision]


def unfit(model: nn.Module, precision: str) -> list[str]:
    """The paths of the plain linears of ``model`` whose shape ``precision`` cannot hold (int4: an input
    width that is not a multiple of its blocks), which stay in float."""
    return [path for path in linear_paths(model) if not module_for(precision, path).fits(model.get_submodule(path))]


def quantize(model: nn.Module, precision: str, registry: Registry | None = None) -> int:
    """Replace every plain nn.Linear of ``model`` (in place) by the module of ``precision`` (QUANTIZED, the
    head HEADS), but those its components keep in float (:func:`kept_float`) and those it cannot hold
    (:func:`unfit`); return how many were replaced.

    Raises:
        GptzooError: a Linear's weights hold NaN or infinity (rounding would hide them), or a weight
            larger than the format holds (int4's float16 minimums: 65504), before anything is replaced.
    """
    kept = set(kept_float(model, registry)) | set(unfit(model, precision))
    linears = [
        (join(prefix, name), parent, name, child)
        for prefix, parent in model.named_modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and join(prefix, name) not in kept
    ]
    broken = [path for path, *_, linear in linears if not linear.weight.detach().isfinite().all()]
    if broken:
        raise GptzooError(
            f"the weights of {_some(broken)} hold NaN or infinity (e.g. from a diverged training run), which "
            f"{precision} would round away; check the weights"
        )
    peaks = {path: linear.weight.detach().abs().max().item() for path, *_, linear in linears if linear.weight.numel()}
    beyond = [path for path, peak in peaks.items() if peak > module_for(precision, path).largest]
    if beyond:
        held = module_for(precision, beyond[0]).largest
        raise GptzooError(
            f"the weights of {_some(beyond)} reach {peaks[beyond[0]]:.6g}, beyond the {held:g} that {precision}'s "
            "float16 block scales hold; load it with --dtype int8 or a float dtype"
        )
    for path, parent, name, linear in linears:
        setattr(parent, name, module_for(precision, path).from_linear(linear))
    return len(linears)

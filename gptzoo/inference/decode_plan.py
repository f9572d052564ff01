"""A whole decoding step in one native call: the model's plan, written once per generation.

The eager forward of one new token runs ~50 torch operations per layer, each a few microseconds of
dispatch; on a small model that is as long as streaming the weights. Here the model and its
components describe a step once, as a list of native operations (native/step.c) over buffers
allocated up front, and each step is then one call. Each module is described by the lowering of
its class (gptzoo.inference.lowerings: the built-in ones, and those plugins register), which
appends its operations through the plan it is given (gptzoo.inference.plan.DecodePlan, implemented
here by :class:`NativePlan`).

A module without a lowering, or one that changes what its lowering describes (a subclass
overriding ``forward``, or a method the lowering depends on), a module with forward hooks: a split
plan (``compile_step(..., split=True)``, what generate uses) runs that module's own torch forward
between the native operations (an :class:`EagerPart`: the module reads a (B, 1, width) view of its
source buffer and its result is written to its destination; an attention or a block also gets the
step's AttentionContext, made by the model's own code, and its layer's cache), so the rest of the
step stays native; without ``split`` the plan refuses it. A position encoding with an attention
bias runs every attention eagerly in a split plan (the plan has no attention bias) and refuses a
strict one; a model off the CPU or in another dtype than float32/bfloat16: then :func:`compile_step`
returns None with the reason, and decoding keeps the eager forward. The plan computes what the
eager step computes, with the same roundings in the activations' dtype, up to the order of the
sums (tests/inference/test_decode_plan.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gptzoo.errors import GptzooError
from gptzoo.inference.lowerings import Lowerings, Unsupported
from gptzoo.inference.matvec import KINDS, MAX_ROWS, Q4_BLOCK, QUANTIZED, kernel_threads, scale_shape
from gptzoo.inference.native import abi, library
from gptzoo.inference.plan import Buffer, PositionStep, Route
from gptzoo.interfaces import AttentionContext, Position, Positions
from gptzoo.model.kv_cache import KVCache
from gptzoo.registry import Registry, default_registry

ERRORS = {code: meaning for code, meaning in abi.ERRORS.values()}
"""decode_step's error code -> what it means."""


@dataclass
class EagerPart:
    """A module that a split plan runs with its own torch forward in each step, and why it has no
    native operations (the refusal its lowering, or the lack of one, gave)."""

    module: nn.Module
    reason: str
    run: Callable[[Positions], None]
    """Runs the module on its source buffer and writes its destination, at the step's positions."""


class NativePlan:
    """The operations of one decoding step for ``batch`` rows in ``dtype``, with the buffers they use:
    gptzoo.inference.plan.DecodePlan, which lowerings are written against, for step.c; each module is
    lowered by its lowering in ``lowerings`` (default: the built-in ones)."""

    def __init__(
        self,
        batch: int,
        dtype: torch.dtype,
        max_keys: int,
        key_mask: Tensor | None = None,
        lowerings: Lowerings | None = None,
        *,
        context: Callable[[Positions, Position], AttentionContext] | None = None,
    ) -> None:
        """context: the model's AttentionContext of a step's positions for a position encoding
        (GPT.attention_context); given, a module the plan cannot describe runs its eager forward
        between the native operations (an :class:`EagerPart`) instead of refusing the plan."""
        if dtype not in (torch.float32, torch.bfloat16):
            raise Unsupported(f"activations in {dtype} (the plan takes float32 and bfloat16)")
        self.batch, self.dtype, self.max_keys = batch, dtype, max_keys
        self.lowerings = lowerings if lowerings is not None else Lowerings()
        self.key_mask = key_mask
        """(batch, max_keys) bool, which keys are real tokens (the cache's, updated at each step), or
        None: rows not left-padded, every key real."""
        self.kind = KINDS[dtype]
        self.context = context
        self.ops: list[abi.Op | EagerPart] = []
        """The step in order: native operations, and the modules run eagerly between them."""
        self.keep: list[Tensor] = []
        """Every tensor an operation points to, alive as long as the plan."""
        self.subplans: list[ctypes.Array] = []
        """The operations of each expert of a mixture, which its operation points to."""
        self.before_step: list[Callable[[Positions], None]] = []
        """Run before each step with its positions: they rewrite the position-dependent tables."""
        self.scores = torch.empty(max_keys, dtype=torch.float32)
        self._positions: dict[int, tuple[PositionStep, Position]] = {}
        """id of a PositionStep this plan made -> it and its position encoding (an eager attention's context)."""
        self._contexts: dict[int, tuple[Positions, AttentionContext]] = {}
        """id of a position encoding -> the positions of the latest step and its context."""
        self.biased: str | None = None
        """Why no attention is native: a position encoding of the model biases attention (a split plan)."""

    @staticmethod
    def refuse(reason: str) -> None:
        """Give up on the module being lowered (it runs its eager forward in a split plan; otherwise the
        model decodes with its eager forward); ``reason`` says why."""
        raise Unsupported(reason)

    def buffer(self, width: int) -> Buffer:
        """A new (batch, width) activation buffer, alive as long as the plan."""
        self.keep.append(torch.zeros(self.batch, width, dtype=self.dtype))
        return Buffer(self.keep[-1])

    def _op(self, name: str, *, p: tuple = (), n: tuple = (), f: tuple = (), wkind: int = 0, mode: int = 0) -> None:
        op = abi.Op(code=abi.OPS[name], kind=self.kind, wkind=wkind, mode=mode)
        for i, value in enumerate(p):
            op.p[i] = value if isinstance(value, int) or value is None else value.data_ptr()
        for i, value in enumerate(n):
            op.n[i] = value
        for i, value in enumerate(f):
            op.f[i] = value
        self.keep.extend(t for t in p if isinstance(t, Tensor))
        self.ops.append(op)

    def _weight(self, tensor: Tensor, what: str, dtypes: tuple[torch.dtype, ...] | None = None) -> int:
        """The kernels' code of a weight's dtype; it must be a contiguous CPU tensor of one of ``dtypes``
        (default: the activations')."""
        self._check(tensor, what, dtypes or (self.dtype,))
        return KINDS[tensor.dtype]

    @staticmethod
    def _check(tensor: Tensor, what: str, dtypes: tuple[torch.dtype, ...]) -> None:
        if tensor.device.type != "cpu" or tensor.dtype not in dtypes or not tensor.is_contiguous():
            raise Unsupported(f"{what} is {tensor.dtype} on {tensor.device}, the plan needs {dtypes[0]} on the CPU")

    @property
    def eager(self) -> list[EagerPart]:
        """The modules this plan runs with their eager forward, in the step's order."""
        return [op for op in self.ops if isinstance(op, EagerPart)]

    def call(self, module: nn.Module, src: Buffer, dst: Buffer, **kwargs: object) -> None:
        """Append ``module``'s operations, by the lowering of its class (gptzoo.inference.lowerings);
        where it has none or its lowering refuses, and the plan splits, the module's eager forward
        (what it appended so far taken back)."""
        if self.context is None:
            self.lowerings.lower(self, module, src, dst, **kwargs)
            return
        ops, before = len(self.ops), len(self.before_step)
        try:
            self.lowerings.lower(self, module, src, dst, **kwargs)
        except Unsupported as exc:
            run = self._eager(module, src, dst, kwargs)
            if run is None:
                raise
            del self.ops[ops:], self.before_step[before:]
            self.ops.append(EagerPart(module, str(exc), run))

    def _eager(
        self, module: nn.Module, src: Buffer, dst: Buffer, kwargs: dict[str, object]
    ) -> Callable[[Positions], None] | None:
        """The step's run of ``module``'s eager forward from ``src`` to ``dst``, or None for a call
        that is not one of a norm, mlp or linear layer (src, dst), an activation (also ``gated``:
        act(first half) * second half, as GatedMLP's forward), an attention or a block (also
        ``position`` and ``cache``)."""
        batch, width = self.batch, dst.width
        x = src.tensor[:, src.offset : src.offset + src.width].unsqueeze(1)  # (B, 1, width), a view
        out = dst.tensor[:, dst.offset : dst.offset + width]
        name = type(module).__name__

        def write(y: Tensor) -> None:
            if tuple(y.shape) != (batch, 1, width):
                raise GptzooError(
                    f"{name}'s forward gave a result of shape {tuple(y.shape)} where the step needs {(batch, 1, width)}"
                )
            out.copy_(y.view(batch, width))

        if not kwargs:
            return lambda pos: write(module(x))
        if set(kwargs) == {"gated"}:
            if not kwargs["gated"]:
                return lambda pos: write(module(x))
            gate, up = x[..., :width], x[..., width:]
            return lambda pos: write(module(gate) * up)
        step, cache = kwargs.get("position"), kwargs.get("cache")
        if set(kwargs) != {"position", "cache"} or id(step) not in self._positions or self.context is None:
            return None
        encoding, made, context = self._positions[id(step)][1], self._contexts, self.context

        def attend(pos: Positions) -> None:
            latest = made.get(id(encoding))
            if latest is None or latest[0] is not pos:  # one context per step and position encoding
                latest = made[id(encoding)] = (pos, context(pos, encoding))
            write(module(x, latest[1], cache))

        return attend

    def embed(self, table: Tensor, dst: Buffer, scale: float | None) -> None:
        """dst = table[token] (* scale, rounded to the activations' dtype first, as the model does)."""
        wkind = self._weight(table, "the token embedding")
        rounded = 0.0 if scale is None else torch.tensor(scale, dtype=self.dtype).item()
        self._op("embed", p=(table, dst.ptr), n=(table.shape[1], table.shape[0]), f=(rounded,), wkind=wkind)

    def add(self, a: Buffer, b: Buffer, out: Buffer) -> None:
        """out = a + b (whole buffers of one width)."""
        self._whole(a, b, out, same_width=True)
        self._op("add", p=(a.ptr, b.ptr, out.ptr), n=(out.width,))

    def linear(self, weight: Tensor, scale: Tensor | None, bias: Tensor | None, src: Buffer, dst: Buffer) -> None:
        """dst = src W^T (* scale) + bias: W (dst.width, src.width) in the activations' dtype, or int8
        with a float32 scale per row, or 4-bit blocks (dst.width, src.width / 2) uint8 with a float16 scale
        and minimum per block (gptzoo.inference.quantize.Int4Linear; shapes: matvec.scale_shape)."""
        self._whole(src, dst)
        if scale is None:
            wkind, width = self._weight(weight, "a linear layer's weight"), src.width
        else:
            wkind = self._weight(weight, "a quantized weight", tuple(QUANTIZED))
            self._check(scale, "a quantized weight's scale", (QUANTIZED[weight.dtype],))
            width = src.width // 2 if weight.dtype == torch.uint8 else src.width
            if weight.dtype == torch.uint8 and src.width % Q4_BLOCK:
                raise Unsupported(f"4-bit blocks of {Q4_BLOCK} over an input of {src.width}")
            if tuple(scale.shape) != scale_shape(weight, src.width):
                raise Unsupported(f"scales of shape {tuple(scale.shape)} for a weight of {tuple(weight.shape)}")
        if bias is not None:
            self._weight(bias, "a linear layer's bias")
        if tuple(weight.shape) != (dst.width, width):
            raise Unsupported(f"a weight of shape {tuple(weight.shape)} between widths {src.width} and {dst.width}")
        self._op("linear", p=(weight, scale, bias, src.ptr, dst.ptr), n=(dst.width, src.width), wkind=wkind)

    def rmsnorm(self, src: Buffer, dst: Buffer, weight: Tensor, eps: float, mode: str) -> None:
        """gptzoo.inference.plan.DecodePlan.rmsnorm (a row of a wider buffer holds several vectors: per-head
        norms; ``mode`` one of :data:`RMS_MODES`)."""
        dim = weight.numel()
        if src.width != dst.width or src.width % dim:
            raise Unsupported(f"an RMSNorm of {dim} features over {src.width}")
        wkind = self._weight(weight, "an RMSNorm's weight")
        self._op(
            "rmsnorm",
            p=(src.ptr, dst.ptr, weight),
            n=(dim, src.width // dim, src.stride, dst.stride),
            f=(eps,),
            wkind=wkind,
            mode=abi.RMS_MODES[mode],
        )

    def layernorm(self, src: Buffer, dst: Buffer, weight: Tensor, bias: Tensor | None, eps: float) -> None:
        """Each ``weight.numel()`` features of a row normalized to mean 0 and variance 1, then * weight + bias."""
        dim = weight.numel()
        if src.width != dst.width or src.width % dim:
            raise Unsupported(f"a LayerNorm of {dim} features over {src.width}")
        wkind = self._weight(weight, "a LayerNorm's weight")
        if bias is not None:
            self._weight(bias, "a LayerNorm's bias")
        n = (dim, src.width // dim, src.stride, dst.stride)
        self._op("layernorm", p=(src.ptr, dst.ptr, weight, bias), n=n, f=(eps,), wkind=wkind)

    def copy(self, src: Buffer, dst: Buffer) -> None:
        self._whole(src, dst, same_width=True)
        self._op("copy", p=(src.ptr, dst.ptr), n=(dst.width,))

    def rope(self, heads: Buffer, head_dim: int, position: PositionStep) -> None:
        """Rotate each head of ``heads`` (head_dim features each) by the step's rotary tables."""
        if position.rotary is None:
            return
        cos, sin, in_float32 = position.rotary
        dim = cos.shape[1]
        if dim > head_dim or heads.width % head_dim:
            raise Unsupported(f"{dim} rotary features in heads of {head_dim}")
        self._op(
            "rope",
            p=(heads.ptr, cos, sin),
            n=(heads.stride, heads.width // head_dim, head_dim, dim, dim),
            mode=int(in_float32),
        )

    def attend(
        self,
        qkv: Buffer,
        sizes: tuple[int, int, int],
        keys: Tensor,
        values: Tensor,
        out: Buffer,
        *,
        window: int,
        scale: float,
        softcap: float,
        fused: bool,
        sinks: Tensor | None = None,
    ) -> None:
        """gptzoo.inference.plan.DecodePlan.attend; the cache is (B, nkv, slots, hs) of the activations' dtype."""
        if self.biased is not None:
            raise Unsupported(self.biased)
        nh, nkv, hs = sizes
        if not qkv.whole or not out.whole or out.width != nh * hs or qkv.width != (nh + 2 * nkv) * hs:
            raise Unsupported("attention buffers of unexpected widths")
        for cache in (keys, values):
            self._weight(cache, "the KV cache")
            if tuple(cache.shape[:2]) != (self.batch, nkv) or cache.shape[3] != hs:
                raise Unsupported(f"a KV cache of shape {tuple(cache.shape)}")
        mask = self.key_mask
        n = (qkv.stride, 0, nh * hs, (nh + nkv) * hs, nh, nkv, hs, keys.shape[2], window, self.max_keys)
        n += (0 if mask is None else mask.shape[1],)
        if fused and softcap:
            raise Unsupported("a fused attention kernel with a softcap")
        wkind = 0
        if sinks is not None:
            if fused or tuple(sinks.shape) != (nh,):
                raise Unsupported(f"sinks of shape {tuple(sinks.shape)} for {nh} heads (explicit attention only)")
            wkind = self._weight(sinks, "the attention sinks")
        p = (qkv.ptr, keys, values, out.ptr, self.scores, mask, sinks)
        mode = abi.ATTEND_MODES["fused" if fused else "explicit"]
        self._op("attend", p=p, n=n, f=(scale, softcap), wkind=wkind, mode=mode)

    def activate(self, src: Buffer, dst: Buffer, name: str, *, gated: bool) -> None:
        """dst = act(src) or, gated, act(src's first half) * its second half."""
        width = dst.width
        if src.width != (2 * width if gated else width):
            raise Unsupported(f"an activation from width {src.width} to {width}")
        self._op(
            "activate", p=(src.ptr, dst.ptr), n=(width, src.stride, dst.stride, int(gated)), mode=abi.ACTIVATIONS[name]
        )

    def clamp(self, buf: Buffer, low: float, high: float, shift: float = 0.0) -> None:
        """buf = clamp(buf, low, high) + shift, over the buffer's columns."""
        self._op("clamp", p=(buf.ptr,), n=(buf.width, buf.stride), f=(low, high, shift))

    def sigmoid_scale(self, gate: Buffer, src: Buffer, dst: Buffer) -> None:
        """dst = sigmoid(gate) * src: ``gate`` one column, or as many as src's (feature by feature); src and dst
        whole buffers of one width."""
        self._whole(src, dst, same_width=True)
        if gate.width not in (1, dst.width):
            raise Unsupported(f"a gate of {gate.width} values per row (sigmoid_scale takes one, or {dst.width})")
        self._op("sigmoid_scale", p=(gate.ptr, src.ptr, dst.ptr), n=(dst.width, gate.stride, int(gate.width > 1)))

    def route(
        self,
        logits: Buffer,
        *,
        top_k: int,
        scoring: str,
        normalize: bool,
        routed_scale: float = 1.0,
        groups: int = 1,
        group_top_k: int = 1,
        group_score: str = "max",
        score_bias: Tensor | None = None,
    ) -> Route:
        """gptzoo.inference.plan.DecodePlan.route."""
        experts = logits.width
        if scoring not in abi.SCORINGS or group_score not in abi.GROUP_SCORES:
            raise Unsupported(f"a router scoring {scoring!r} with group score {group_score!r}")
        if not 1 <= top_k <= experts or groups < 1 or experts % groups or not 1 <= group_top_k <= groups:
            raise Unsupported(f"a router of top_k {top_k} over {experts} experts in {groups} groups")
        if score_bias is not None:  # added in float32 whatever its dtype, as the eager forward promotes it
            score_bias = score_bias.detach().float().contiguous()
            self._weight(score_bias, "a router's score bias", (torch.float32,))
        route = Route(torch.zeros(self.batch, top_k, dtype=torch.int64), torch.zeros(self.batch, top_k))
        self._op(
            "route",
            p=(logits.ptr, score_bias, route.experts, route.weights),
            n=(logits.stride, experts, top_k, groups, group_top_k, int(normalize), abi.GROUP_SCORES[group_score]),
            f=(routed_scale,),
            mode=abi.SCORINGS[scoring],
        )
        return route

    def mixture(self, route: Route, experts: Sequence[nn.Module], src: Buffer, dst: Buffer) -> None:
        """gptzoo.inference.plan.DecodePlan.mixture: each expert lowered into operations of its own (a
        plan for the same rows, which the mixture runs on the rows that chose it)."""
        self._whole(src, dst, same_width=True)
        top_k = route.experts.shape[1]
        inputs, outputs = self.buffer(src.width), self.buffer(dst.width)
        table = torch.zeros(len(experts), 2, dtype=torch.int64)
        sub = NativePlan(self.batch, self.dtype, self.max_keys, self.key_mask, self.lowerings)  # every expert's
        for e, expert in enumerate(experts):
            first = len(sub.ops)
            sub.lowerings.lower(sub, expert, inputs, outputs)
            if sub.before_step:
                raise Unsupported(f"expert {e} ({type(expert).__name__}) has operations that depend on the position")
            if len(sub.ops) == first:
                raise Unsupported(f"expert {e} ({type(expert).__name__}) lowers to no operation")
            ops = (abi.Op * (len(sub.ops) - first))(*sub.ops[first:])
            self.subplans.append(ops)
            table[e] = torch.tensor([ctypes.addressof(ops), len(ops)])
        self.keep.extend(sub.keep)
        self.subplans.extend(sub.subplans)
        sums = torch.zeros(self.batch, dst.width)
        p = (src.ptr, dst.ptr, route.experts, route.weights, table, inputs.ptr, outputs.ptr, sums)
        self._op("mixture", p=p, n=(dst.width, top_k, len(experts)))

    def scale(self, src: Buffer, dst: Buffer, factor: float, *, divide: bool = False) -> None:
        """dst = src * factor (or src / factor), whole buffers of one width (the same one too)."""
        self._whole(src, dst, same_width=True)
        self._op("scale", p=(src.ptr, dst.ptr), n=(dst.width, int(divide)), f=(factor,))

    def softcap(self, buf: Buffer, cap: float) -> None:
        self._whole(buf)
        self._op("softcap", p=(buf.ptr,), n=(buf.width,), f=(cap,))

    def position(self, position: Position, device: torch.device) -> PositionStep:
        """What ``position`` adds to a step, rewritten before each from its own embed and rotary."""
        probe = Positions.plain(0, 1, device)
        if position.attn_bias(probe.queries, probe.keys) is not None:
            reason = f"{type(position).__name__} biases attention (the plan has no attention bias)"
            if self.context is None:
                raise Unsupported(reason)
            self.biased = reason  # a split plan: every attention runs its eager forward, with the bias
        step = PositionStep(None)
        self._positions[id(step)] = (step, position)
        rotary = position.rotary(probe.queries)
        if rotary is not None:
            tables = self.lowerings.rotary_tables(rotary)
            if tables is None:
                raise Unsupported(
                    f"{type(rotary).__name__} (from {type(position).__name__}) has no rotary tables (a plugin "
                    "registers them with register_rotary_tables)"
                )
            probe_cos, _, in_float32 = tables(rotary)
            dim = probe_cos.numel()
            cos, sin = torch.empty(self.batch, dim), torch.empty(self.batch, dim)
            step.rotary = (cos, sin, in_float32)

            def rotate(pos: Positions) -> None:
                new_cos, new_sin, _ = tables(position.rotary(pos.queries))
                cos.copy_(new_cos.view(-1, dim).expand(self.batch, dim))  # one row for all, or one per row
                sin.copy_(new_sin.view(-1, dim).expand(self.batch, dim))

            self.before_step.append(rotate)
        return step

    def embedding(self, position: Position, dst: Buffer) -> None:
        """Add ``position``'s embedding of each row's position to ``dst``, if it has one."""
        probe = Positions.plain(0, 1, dst.tensor.device)
        if position.embed(probe.queries) is None:
            return
        rows = self.buffer(dst.width)

        def embed(pos: Positions) -> None:
            emb = position.embed(pos.queries).to(self.dtype)
            rows.tensor.copy_(emb.view(-1, dst.width).expand(self.batch, dst.width))

        self.before_step.append(embed)
        self.add(dst, rows, dst)

    def slice_heads(
        self, src: Buffer, dst: Buffer, heads: int, width: int, *, src_step: int, dst_step: int, deinterleave: bool
    ) -> None:
        """gptzoo.inference.plan.DecodePlan.slice_heads (``width`` even where it de-interleaves)."""
        self._heads(src, heads, width, src_step)
        self._heads(dst, heads, width, dst_step)
        if deinterleave and width % 2:
            raise Unsupported(f"{width} interleaved rotary features (an odd number)")
        n = (heads, width, src.stride, src_step, dst.stride, dst_step)
        self._op("slice_heads", p=(src.ptr, dst.ptr), n=n, mode=int(deinterleave))

    def heads_linear(self, weight: Tensor, src: Buffer, dst: Buffer, *, src_step: int, dst_step: int) -> None:
        """gptzoo.inference.plan.DecodePlan.heads_linear: ``weight`` (heads, out, in) of the activations'
        dtype on the CPU, each head's (out, in) block contiguous."""
        if weight.dim() != 3 or weight.device.type != "cpu" or weight.dtype != self.dtype:
            raise Unsupported(f"per-head weights of shape {tuple(weight.shape)} in {weight.dtype} on {weight.device}")
        heads, out, width = weight.shape
        if weight.stride(2) != 1 or weight.stride(1) != width:
            raise Unsupported(f"per-head weights whose rows are not contiguous (strides {weight.stride()})")
        self._heads(src, heads, width, src_step)
        self._heads(dst, heads, out, dst_step)
        n = (heads, out, width, weight.stride(0), src.stride, src_step, dst.stride, dst_step)
        self._op("heads_linear", p=(weight, src.ptr, dst.ptr), n=n, wkind=KINDS[weight.dtype])

    def latent_attend(
        self, q: Buffer, kv: Buffer, latent: Tensor, k_rope: Tensor, out: Buffer, *, heads: int, scale: float
    ) -> None:
        """gptzoo.inference.plan.DecodePlan.latent_attend; the cache tensors of the activations' dtype."""
        if self.biased is not None:
            raise Unsupported(self.biased)
        rank, rope_dim = latent.shape[-1], k_rope.shape[-1]
        for cache in (latent, k_rope):
            self._weight(cache, "the latent cache")
        slots = latent.shape[1]
        if tuple(latent.shape) != (self.batch, slots, rank) or tuple(k_rope.shape) != (self.batch, 1, slots, rope_dim):
            raise Unsupported(f"a latent cache of shapes {tuple(latent.shape)} and {tuple(k_rope.shape)}")
        if q.width != heads * (rope_dim + rank) or kv.width != rank + rope_dim or not out.whole:
            raise Unsupported("latent attention buffers of unexpected widths")
        if out.width != heads * rank:
            raise Unsupported(f"a latent attention's output of width {out.width} for {heads} heads of {rank}")
        mask = self.key_mask
        n = (q.stride, kv.stride, rank, rope_dim, heads, slots, 0 if mask is None else mask.shape[1])
        self._op("latent_attend", p=(q.ptr, kv.ptr, latent, k_rope, out.ptr, mask), n=n, f=(scale,))

    @staticmethod
    def _heads(buf: Buffer, heads: int, width: int, step: int) -> None:
        """``heads`` runs of ``width`` columns, ``step`` apart, must lie within ``buf``."""
        if heads < 1 or width < 1 or step < width or (heads - 1) * step + width > buf.width:
            raise Unsupported(f"{heads} heads of {width} columns, {step} apart, in a buffer of width {buf.width}")

    @staticmethod
    def _whole(*buffers: Buffer, same_width: bool = False) -> None:
        if not all(b.whole for b in buffers):
            raise Unsupported("an operation over part of a buffer")
        if same_width and len({b.width for b in buffers}) > 1:
            raise Unsupported(f"an elementwise operation over widths {[b.width for b in buffers]}")


class CompiledStep:
    """``step(tokens)`` = ``model(tokens, cache)`` for one token per row, as one native call, or (a
    split plan) as native calls between the eager forwards of the modules in :attr:`eager`."""

    def __init__(self, model: nn.Module, cache: KVCache, plan: NativePlan, logits: Buffer) -> None:
        self.model, self.cache, self.plan, self.logits = model, cache, plan, logits
        native = [op for op in plan.ops if isinstance(op, abi.Op)]
        self.ops = (abi.Op * len(native))(*native)
        self.eager = plan.eager
        """The modules run with their eager forward in each step (none: the step is one native call)."""
        self.segments: list[tuple[int, int] | EagerPart] = []
        """The step in order: runs of native operations (first, count) and the eager parts between them."""
        first = 0
        for op in plan.ops:
            if isinstance(op, EagerPart):
                self.segments.append(op)
            elif self.segments and isinstance(self.segments[-1], tuple):
                self.segments[-1] = (self.segments[-1][0], self.segments[-1][1] + 1)
            else:
                self.segments.append((first, 1))
            first += isinstance(op, abi.Op)
        self.tokens = torch.empty(plan.batch, dtype=torch.int64)
        self.failed = ctypes.c_long(0)
        self.device = logits.tensor.device
        self.lib = library()
        limit = model.max_positions
        self.limit = cache.max_len if limit is None else min(cache.max_len, limit)
        """The most positions; a step past them runs the eager forward, which says what is wrong."""

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens (B, 1) -> logits (B, 1, V), the cache one token longer."""
        if tokens.shape != (self.plan.batch, 1) or self.cache.length + 1 > self.limit:
            return self.model(tokens, self.cache)  # the eager forward, which explains what is wrong
        pos = self.cache.advance(1, None, self.device)
        for rewrite in self.plan.before_step:
            rewrite(pos)
        self.tokens.copy_(tokens.reshape(-1))
        base, size = ctypes.addressof(self.ops), ctypes.sizeof(abi.Op)
        for segment in self.segments:
            if isinstance(segment, EagerPart):
                segment.run(pos)
                continue
            first, count = segment
            code = self.lib.decode_step(
                base + first * size,
                count,
                self.plan.batch,
                pos.start,
                self.tokens.data_ptr(),
                kernel_threads(),
                ctypes.byref(self.failed),
            )
            if code != 0:
                raise GptzooError(
                    f"the native decoding step failed at its operation {first + self.failed.value}: "
                    f"{ERRORS.get(code, f'code {code}')}"
                )
        return self.logits.tensor.clone().view(self.plan.batch, 1, -1)


def compile_step(
    model: nn.Module, cache: KVCache, batch: int, *, registry: Registry | None = None, split: bool = False
) -> tuple[CompiledStep | None, str | None]:
    """The model's decoding step for ``batch`` rows over ``cache`` (made for them, the prompts already
    in it) as one native call, or (None, the reason) where the plan cannot describe it (then the
    eager forward decodes). Modules are lowered by the built-in lowerings and those the plugins of
    ``registry`` register (default: the registry the model was built with, else the shared one).
    ``split``: a module the plan cannot describe runs its eager forward within the step (the step's
    ``eager`` lists them, with the reasons) rather than refusing the plan."""
    if library() is None:
        return None, "no native kernels"
    if torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return None, "gradients or autocast wanted (the plan computes neither)"
    weight = model.wte.weight
    if weight.device.type != "cpu" or not 0 < batch <= MAX_ROWS:
        return None, f"a batch of {batch} on {weight.device} (the plan takes 1 to {MAX_ROWS} rows on the CPU)"
    try:
        if registry is None:
            registry = getattr(model, "registry", None) or default_registry()
        context = (lambda pos, position: model.attention_context(pos, weight.dtype, position)) if split else None
        plan = NativePlan(batch, weight.dtype, cache.max_len, cache.key_mask, Lowerings(registry), context=context)
        logits = plan.lowerings.lower(plan, model, cache)
    except Unsupported as exc:
        return None, str(exc)
    return CompiledStep(model, cache, plan, logits), None

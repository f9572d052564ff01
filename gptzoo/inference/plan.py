"""What a component's lowering writes its share of a native CPU decoding step with: the plan
(:class:`DecodePlan`, the protocol lowerings are typed against; gptzoo.inference.decode_plan
implements it), its activation buffers (:class:`Buffer`), a position encoding's share of a step
(:class:`PositionStep`) and a router's choice of experts (:class:`Route`). A plugin's lowering (the
``register_decode_lowerings`` hook) imports them from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from gptzoo.interfaces import Position


@dataclass(frozen=True)
class Buffer:
    """Columns ``offset``..``offset + width`` of a (batch, row) activation tensor the plan owns."""

    tensor: Tensor
    offset: int = 0
    width: int = -1

    def __post_init__(self) -> None:
        if self.width < 0:
            object.__setattr__(self, "width", self.tensor.shape[1] - self.offset)

    @property
    def ptr(self) -> int:
        return self.tensor.data_ptr() + self.offset * self.tensor.element_size()

    @property
    def stride(self) -> int:
        """Elements from one row to the next."""
        return self.tensor.shape[1]

    @property
    def whole(self) -> bool:
        return self.offset == 0 and self.width == self.tensor.shape[1]

    def cols(self, offset: int, width: int) -> Buffer:
        return Buffer(self.tensor, self.offset + offset, width)


@dataclass
class PositionStep:
    """A position encoding's share of a step: its rotary tables (cos, sin; float32, rewritten before
    each step) and whether they rotate in float32, or None without rotation."""

    rotary: tuple[Tensor, Tensor, bool] | None


@dataclass(frozen=True)
class Route:
    """A router's choice for each row of a step (:meth:`DecodePlan.route`): the chosen experts (batch,
    top_k) int64 in ascending order and their weights (batch, top_k) float32, rewritten by each step."""

    experts: Tensor
    weights: Tensor


class DecodePlan(Protocol):
    """What a component's lowering writes its share of a CPU decoding step with: native
    operations over (batch, width) activation buffers (gptzoo.inference.decode_plan builds one per
    generation, native/step.c runs it; docs/plugins.md, "Fast CPU decoding"). Each operation rounds
    where the eager forward rounds in the activations' dtype; weights must be contiguous CPU tensors
    of that dtype (for ``linear`` also int8 with a float32 scale per row, or 4-bit blocks with a float16
    scale per block: gptzoo.inference.quantize)."""

    batch: int
    dtype: torch.dtype
    key_mask: Tensor | None
    """(batch, keys) bool, which cached keys are real tokens (rows were left-padded), or None."""

    def refuse(self, reason: str) -> None:
        """Give up on this module: it runs its eager forward (a split plan) or the model does; ``reason`` says why."""

    def buffer(self, width: int) -> Buffer:
        """A new (batch, width) activation buffer."""
        ...

    def call(self, module: nn.Module, src: Buffer, dst: Buffer, **kwargs: object) -> None:
        """A child's operations, by the lowering of its class (an nn.Linear is a product, nn.Identity a copy)."""

    def linear(self, weight: Tensor, scale: Tensor | None, bias: Tensor | None, src: Buffer, dst: Buffer) -> None:
        """dst = src W^T (* scale per output) + bias."""

    def rmsnorm(self, src: Buffer, dst: Buffer, weight: Tensor, eps: float, mode: str) -> None:
        """Each ``weight.numel()`` features over their root mean square (+ eps), in float32; ``mode``:
        "plain" (rounded, then * weight), "scale_in_float32" (* weight, then rounded), "offset" (* (1 + weight))."""

    def layernorm(self, src: Buffer, dst: Buffer, weight: Tensor, bias: Tensor | None, eps: float) -> None:
        """Each ``weight.numel()`` features to mean 0 and variance 1, then * weight + bias."""

    def copy(self, src: Buffer, dst: Buffer) -> None: ...

    def add(self, a: Buffer, b: Buffer, out: Buffer) -> None:
        """out = a + b."""

    def rope(self, heads: Buffer, head_dim: int, position: PositionStep) -> None:
        """Rotate each head of ``heads`` by the step's rotary tables (rotate-half; none: nothing)."""

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
        """Write this token's k and v into the cache (keys/values (B, nkv, slots, hs), key i in slot
        i % slots), then out = softmax(softcap(q K^T scale)) V over the last ``window`` keys (0: all)
        that are real tokens. ``qkv`` holds q (nh heads), k and v (nkv each); sizes (nh, nkv, hs);
        ``fused``: round as scaled_dot_product_attention's CPU kernel, else as torch's operations one by
        one; ``sinks`` (nh,): a sink logit per head, a key of its own in the softmax whose value is
        dropped (explicit only)."""

    def activate(self, src: Buffer, dst: Buffer, name: str, *, gated: bool) -> None:
        """dst = act(src), or gated: act(first half) * second half; name: gelu, gelu_tanh, relu, silu or
        quick_gelu."""

    def clamp(self, buf: Buffer, low: float, high: float, shift: float = 0.0) -> None:
        """buf = clamp(buf, low, high) + shift (part of a buffer: ``buf.cols``)."""

    def sigmoid_scale(self, gate: Buffer, src: Buffer, dst: Buffer) -> None:
        """dst = sigmoid(gate) * src, ``gate`` one value per row or one per column of src."""

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
        """Each row's top_k experts from a router's ``logits`` (one per expert) and their weights, in
        float32, by the rules of gptzoo_plugins._moe's Router (scoring softmax, sigmoid or topk_softmax;
        group-limited selection; ``score_bias`` (experts,) float32 for choosing only; ``normalize`` the
        weights to sum 1; times ``routed_scale``). Of experts with equal scores the lower index is
        chosen first (torch.topk leaves ties unordered: the eager forward may choose the other, which only
        a saturated or coarsely rounded router produces)."""
        ...

    def mixture(self, route: Route, experts: Sequence[nn.Module], src: Buffer, dst: Buffer) -> None:
        """dst = sum over each row's chosen experts of weight * expert(src), each product rounded to the
        activations' dtype and added in ascending order of the experts; only the chosen experts run (each
        on the rows that chose it), each described by the lowering of its class (a norm's or an mlp's:
        src -> dst)."""

    def softcap(self, buf: Buffer, cap: float) -> None:
        """buf = tanh(buf / cap) * cap."""

    def embed(self, table: Tensor, dst: Buffer, scale: float | None) -> None:
        """dst = table[token] (* scale)."""

    def embedding(self, position: Position, dst: Buffer) -> None:
        """dst += ``position``'s embedding of each row's position, if it has one."""

    def position(self, position: Position, device: torch.device) -> PositionStep:
        """``position``'s share of each step (its rotary tables). An attention bias has no native
        operation: a plan that cannot split refuses it here, a split one refuses each :meth:`attend`
        (every attention then runs its eager forward, whose context holds the bias)."""
        ...

    def slice_heads(
        self, src: Buffer, dst: Buffer, heads: int, width: int, *, src_step: int, dst_step: int, deinterleave: bool
    ) -> None:
        """For each head h, dst's ``width`` columns from h * dst_step = src's from h * src_step (src and
        dst may be the same columns); ``deinterleave``: rotary features stored as pairs (x0, x1), (x2,
        x3), ... (DeepSeek's) into the rotate-half order (x0, x2, ..., x1, x3, ...). A copy, rounding nothing."""

    def heads_linear(self, weight: Tensor, src: Buffer, dst: Buffer, *, src_step: int, dst_step: int) -> None:
        """A product of its own weight per head: for each h of weight (heads, out, in), dst's ``out``
        columns from h * dst_step = weight[h] @ src's ``in`` columns from h * src_step, rounded once.
        ``weight``'s rows are contiguous; its heads may lie apart in a larger tensor (a view)."""

    def latent_attend(
        self, q: Buffer, kv: Buffer, latent: Tensor, k_rope: Tensor, out: Buffer, *, heads: int, scale: float
    ) -> None:
        """Multi-head latent attention's absorbed step (gptzoo_plugins._mla): write this token's latent
        and rotated key (``kv``: c then r columns) into the cache (``latent`` (B, slots, c), ``k_rope``
        (B, 1, slots, r)) at the step's position; then for each head of ``q`` (its r rotated rotary
        features, then its c latent query W_k^T q_nope) out's c columns = softmax((q_latent . latent_j +
        q_rope . k_rope_j) * scale) weighted sum of the latents, over the keys that are real tokens;
        rounded where LatentAttention.absorbed rounds (softmax in float32)."""

"""The interfaces that components implement and the model calls.

`hookspecs.py` holds each kind's contract (what its factory takes, what its product must expose:
``CONTRACTS``); this module holds the typed shape of each kind's product, named by
``Contract.interface``, and the few shared types those contracts mention:

- :class:`Norm`, :class:`Activation`, :class:`MLP`, :class:`Attention`: Protocols of built modules.
- :class:`Position`: base class of position encodings, with three optional capabilities.
- :class:`Rotary`: what a rotary position encoding hands to attention once per forward pass.
- :class:`AttentionContext`: everything position-dependent that attention needs, computed once per
  forward pass by the model and shared by all layers.
- :class:`LayerKVCache` and :class:`KVCache`: preallocated key/value storage for prefill and decode
  (each attention allocates its own layer's cache).
- :class:`Sampler`: base class of the sampler chain's steps, and :class:`SamplerFlag`, the
  command-line flag a step may declare.
- :class:`TensorMap`: how one of a component's tensors is stored in another checkpoint layout.
- :class:`DecodePlan`, :class:`Buffer`, :class:`PositionStep`: what a component's lowering writes
  its share of a native CPU decoding step with (gptzoo.inference.lowerings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from gptzoo.errors import GptzooError


@runtime_checkable
class Norm(Protocol):
    """A normalization layer: x (B, T, dim) -> (B, T, dim), same dtype."""

    def __call__(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class Activation(Protocol):
    """An elementwise activation: any shape -> same shape and dtype."""

    def __call__(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class MLP(Protocol):
    """The feed-forward part of a block: x (B, T, d_model) -> (B, T, d_model)."""

    c_proj: nn.Linear
    """The projection that writes into the residual stream (its init is scaled by 1/sqrt(2 n_layer))."""

    def __call__(self, x: Tensor) -> Tensor: ...

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """Matmul FLOPs of a forward over (batch, seq_len) tokens, by part name (1 multiply-add = 2)."""
        ...


@runtime_checkable
class Attention(Protocol):
    """Causal self-attention: x (B, T, d_model), an AttentionContext and an optional per-layer cache
    -> (B, T, d_model)."""

    c_proj: nn.Linear
    """The output projection (its init is scaled by 1/sqrt(2 n_layer))."""

    def __call__(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor: ...

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LayerKVCache:
        """Preallocated key/value storage for batch_size sequences of up to max_len tokens."""
        ...

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """The bytes ``init_cache(batch_size, max_len, dtype=dtype)`` allocates, computed without allocating."""
        ...

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """Matmul FLOPs of a cache-less forward over (batch, seq_len) tokens, by part name."""
        ...


class Rotary(Protocol):
    """A rotation of queries and keys, precomputed for the positions of one forward pass."""

    def apply(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate q (B, nh, T, hs) and k (B, nkv, T, hs); shapes and dtypes are preserved."""
        ...


class Position(nn.Module):
    """Base class of position encodings. Every capability is a no-op unless a subclass overrides it.

    A position encoding sees absolute positions, a long tensor (B, T) whose B may be 1 (the same
    positions for every row) or the batch (rows left-padded to a common length start at different
    offsets). So it works with a KV cache: the model passes the positions of the new tokens, and
    for attention biases, of all keys.
    """

    max_positions: int | None = None
    """The largest number of positions it can encode, or None if it extrapolates without limit."""

    def embed(self, positions: Tensor) -> Tensor | None:
        """An embedding (B, T, d) added to the token embeddings, or None."""
        return None

    def rotary(self, positions: Tensor) -> Rotary | None:
        """A rotation of q and k for these query/key positions (B, T), or None."""
        return None

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """An additive attention bias (B, nh, Tq, Tk) in float32 for positions (B, Tq) and (B, Tk),
        or None. The causal mask is added by the model; a bias only describes how distance changes
        the scores."""
        return None


@dataclass(frozen=True)
class AttentionContext:
    """Position-dependent inputs of attention, built once per forward pass for all layers.

    ``mask`` and ``is_causal`` describe every key so far (cached + new, in order), as a cache that
    keeps all of them (:class:`LayerKVCache`) returns them. A layer that keeps only some keys (a
    sliding window's ring buffer) builds its own mask from ``positions`` and ``attn_bias`` instead.

    Attributes:
        start: the absolute position of the first query token (the cache write offset).
        rotary: the q/k rotation for the query positions, or None.
        mask: an additive float mask (B or 1, nh or 1, Tq, Tk) with -inf where a query must not look
            (later tokens, left padding) plus any position bias, in the activation dtype; None when
            ``is_causal`` says everything (or, for one new token after a cache, nothing) needs masking.
        is_causal: True when queries and keys are the same T tokens and only the plain causal mask
            applies (the fast path of scaled_dot_product_attention).
        positions: where the queries and all keys so far sit, and which keys are real tokens (the
            last T keys are this pass's own tokens); the model always sets it, None only in a
            context made by hand.
        attn_bias: the position encoding's ``attn_bias(q_positions, k_positions)`` -> float32
            (B or 1, nh, Tq, Tk) or None, for a layer that masks the keys it holds itself; the model
            always sets it.
    """

    start: int
    rotary: Rotary | None
    mask: Tensor | None
    is_causal: bool
    positions: Positions | None = None
    attn_bias: Callable[[Tensor, Tensor], Tensor | None] | None = None


class LayerKVCache:
    """The cache of an attention that keeps every key: keys and values (B, nkv, max_len, hs) each.

    Each attention allocates its own cache (``init_cache``); the model and :class:`KVCache` ask a
    layer's cache only for ``max_len`` (how many positions it accepts in all) and ``nbytes`` (the
    memory it holds), so a layer may keep fewer positions (a ring buffer of its window) in a cache
    of its own class.
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)  # only positions already written are read
        self.v = torch.empty(shape, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def update(self, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Write k, v (B, nkv, T, hs) at positions start..start+T; return all keys and values so far."""
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache:
    """The caches of all layers, how many positions they hold, and the positions of what comes next.

    When the first call was left-padded (rows of different lengths), the cache also remembers which
    keys are padding and the next position of each row; otherwise both stay None (the fast path).
    """

    def __init__(self, layers: Sequence[LayerKVCache]) -> None:
        self.layers = list(layers)
        self.length = 0
        self.key_mask: Tensor | None = None
        """(B, max_len) bool: True where a key is a real token."""
        self.next_position: Tensor | None = None
        """(B, 1) long: the position of each row's next token."""

    @property
    def max_len(self) -> int:
        return min(layer.max_len for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    @staticmethod
    def bytes_needed(attentions: Iterable[Attention], batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """The bytes the caches of these attention layers would hold for batch_size sequences of up to
        max_len tokens, as each layer sizes its own (``kv_bytes``), allocating nothing.

        Raises:
            GptzooError: a layer's kv_bytes gives anything but a non-negative int.
        """
        total = 0
        for attn in attentions:
            n = attn.kv_bytes(batch_size, max_len, dtype)
            if type(n) is not int or n < 0:
                shown = repr(n) if type(n) in (int, float, bool) else f"an object of type {type(n).__name__}"
                raise GptzooError(
                    f"{type(attn).__name__}.kv_bytes({batch_size}, {max_len}, {dtype}) gave {shown}, not a number "
                    "of bytes; fix the attention plugin (gptzoo.hookspecs, register_attentions)"
                )
            total += n
        return total

    def advance(self, n_tokens: int, attention_mask: Tensor | None, device: torch.device) -> Positions:
        """The positions of ``n_tokens`` new tokens after the cached ones; the cache now counts them.

        attention_mask (B, T) is for the first call only (left-padded prompts): the cache remembers
        which keys are padding and where each row goes on.
        """
        start, end = self.length, self.length + n_tokens
        if attention_mask is not None:
            if start:
                raise GptzooError(
                    "attention_mask is for the first call on a cache (left-padded prompts), not for later ones"
                )
            pos = Positions.padded(attention_mask)
            self.key_mask = torch.zeros(attention_mask.shape[0], self.max_len, dtype=torch.bool, device=device)
            self.key_mask[:, :n_tokens] = pos.key_mask
            self.next_position = pos.queries[:, -1:] + 1
        elif self.key_mask is not None:
            queries = self.next_position + torch.arange(n_tokens, device=device)  # (B, T)
            self.key_mask[:, start:end] = True
            self.next_position = queries[:, -1:] + 1
            key_mask = self.key_mask[:, :end]
            pos = Positions(start, queries, (key_mask.long().cumsum(-1) - 1).clamp(min=0), key_mask)
        else:
            pos = Positions.plain(start, n_tokens, device)
        self.length = end
        return pos


@dataclass(frozen=True)
class Positions:
    """Where the tokens of one forward pass sit: query positions (B or 1, T), key positions
    (B or 1, S) for all keys so far, and which keys are real tokens (B, S), None when all are."""

    start: int
    """The absolute index of the first query token (the cache write offset)."""
    queries: Tensor
    keys: Tensor
    key_mask: Tensor | None

    @classmethod
    def plain(cls, start: int, n_tokens: int, device: torch.device) -> Positions:
        """Tokens start..start+T of unpadded rows, after ``start`` cached ones."""
        queries = torch.arange(start, start + n_tokens, device=device)[None]  # (1, T)
        return cls(start, queries, torch.arange(0, start + n_tokens, device=device)[None], None)

    @classmethod
    def padded(cls, attention_mask: Tensor) -> Positions:
        """Left-padded rows (mask 1 for tokens, 0 for padding): each row counts from its first token."""
        key_mask = attention_mask.bool()
        positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        return cls(0, positions, positions, key_mask)


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


class DecodePlan(Protocol):
    """What a component's lowering writes its share of a CPU decoding step with: native
    operations over (batch, width) activation buffers (gptzoo.inference.decode_plan builds one per
    generation, native/step.c runs it; docs/plugins.md, "Fast CPU decoding"). Each operation rounds
    where the eager forward rounds in the activations' dtype; weights must be contiguous CPU tensors
    of that dtype (int8 with a float32 scale per row for ``linear``)."""

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
    ) -> None:
        """Write this token's k and v into the cache (keys/values (B, nkv, slots, hs), key i in slot
        i % slots), then out = softmax(softcap(q K^T scale)) V over the last ``window`` keys (0: all)
        that are real tokens. ``qkv`` holds q (nh heads), k and v (nkv each); sizes (nh, nkv, hs);
        ``fused``: round as scaled_dot_product_attention's CPU kernel, else as torch's operations one by one."""

    def activate(self, src: Buffer, dst: Buffer, name: str, *, gated: bool) -> None:
        """dst = act(src), or gated: act(first half) * second half; name: gelu, gelu_tanh, relu or silu."""

    def softcap(self, buf: Buffer, cap: float) -> None:
        """buf = tanh(buf / cap) * cap."""

    def embed(self, table: Tensor, dst: Buffer, scale: float | None) -> None:
        """dst = table[token] (* scale)."""

    def embedding(self, position: Position, dst: Buffer) -> None:
        """dst += ``position``'s embedding of each row's position, if it has one."""

    def position(self, position: Position, device: torch.device) -> PositionStep:
        """``position``'s share of each step (its rotary tables); refuses an attention bias."""
        ...


@dataclass(frozen=True)
class SamplerFlag:
    """A sampler step's command-line flag of ``gptzoo generate``: ``--top-k 50`` sets parameter
    ``k`` of step ``top_k`` (the flag is the registered name with '-' for '_')."""

    param: str
    """The factory parameter the flag's value goes to."""
    order: int
    """Where the step goes when the chain lacks it: steps are kept in ascending order (Hugging Face's
    order: repetition_penalty 10, temperature 20, top_k 30, top_p 40, min_p 50)."""
    help: str
    """One line for ``gptzoo generate --help``."""
    type: type = float
    """int or float: how the flag's text is read."""
    zero_is_greedy: bool = False
    """Whether the value 0 asks for greedy decoding instead of this step, as Hugging Face's
    temperature=0 does: every ``sampling_only`` step and any picking step is dropped, and the chain
    ends in the registry's ``greedy`` step."""


class Sampler:
    """Base class of a sampler-chain step: a transform of next-token logits.

    ``__call__(logits (B, V) float, input_ids (B, T) long) -> logits (B, V)``. A step that chooses
    the token itself (greedy) overrides :meth:`pick`; it must then be the last step of a chain.
    """

    picks: bool = False
    """True when this step chooses the token (and so must end the chain)."""

    flag: SamplerFlag | None = None
    """The step's command-line flag, if it has one (read on the factory, before anything is built)."""
    greedy: bool = False
    """True for the picking step a chain ends in when nothing in it samples (Hugging Face's
    do_sample=False: the argmax), and that a flag's ``zero_is_greedy`` asks for; one registered sampler
    declares it (read on the factory)."""
    sampling_only: bool = False
    """True for a step that only matters when sampling (temperature, top_k, ...): ``--temperature 0``
    (greedy) drops it, as Hugging Face does (read on the factory)."""

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        return logits

    def pick(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Choose one token per row (B,) from the logits (B, V)."""
        raise NotImplementedError


@dataclass(frozen=True)
class TensorMap:
    """One tensor of ours and the tensor(s) another layout stores it as, names relative to the
    component. Several tensors of theirs are concatenated along dim 0 in the order given (q, k, v
    -> c_attn); ``groups`` is for a layout that interleaves the parts of a tensor (GPT-NeoX keeps the
    q, k and v rows of each head together); ``transpose`` is for layouts that store a linear weight
    as [in, out] (GPT-2's Conv1D). The same description converts in both directions.
    """

    ours: str
    theirs: tuple[str, ...]
    sizes: tuple[int, ...] = ()
    """The dim-0 size of each of theirs when there are several (to split on export)."""
    transpose: bool = False
    """Theirs is ours transposed (single-tensor maps only)."""
    parts: tuple[int, ...] = ()
    """With ``groups``: the dim-0 sizes of the parts ours is made of, in order (c_attn: q, k, v rows)."""
    groups: int = 1
    """Theirs (their tensors concatenated, when there are several) holds ours' ``parts`` interleaved
    in this many groups along dim 0: group g is the g-th of ``groups`` equal slices of every part, in
    the parts' order. GPT-NeoX's query_key_value, whose rows are [q_h; k_h; v_h] for each head h, is
    c_attn (parts (nh hs, nh hs, nh hs)) in nh groups. 1: no interleaving."""

    def __post_init__(self) -> None:
        if len(self.theirs) > 1 and (self.transpose or len(self.sizes) != len(self.theirs)):
            raise ValueError(f"{self.ours}: a map to several tensors needs one size each and no transpose")
        if self.groups < 1 or (self.groups > 1) != bool(self.parts):
            raise ValueError(f"{self.ours}: groups={self.groups} needs parts (and parts need groups > 1)")
        if self.groups > 1 and (self.transpose or any(p % self.groups for p in self.parts)):
            raise ValueError(
                f"{self.ours}: each of parts {self.parts} must split into groups={self.groups} equal slices, "
                "and interleaved tensors are not transposed"
            )

    def load(self, tensors: Sequence[Tensor]) -> Tensor:
        """Their tensors -> ours."""
        t = torch.cat(list(tensors), dim=0) if len(tensors) > 1 else tensors[0]
        if self.groups > 1:
            t = self._ungroup(t)
        return t.t().contiguous() if self.transpose else t

    def save(self, t: Tensor) -> list[Tensor]:
        """Ours -> their tensors."""
        if self.groups > 1:
            t = self._group(t)
        if len(self.theirs) > 1:
            return [part.contiguous() for part in t.split(list(self.sizes), dim=0)]
        return [t.t().contiguous() if self.transpose else t]

    def _check_rows(self, t: Tensor) -> None:
        if t.shape[0] != sum(self.parts):
            raise ValueError(f"{self.ours}: {t.shape[0]} rows, but parts {self.parts} add up to {sum(self.parts)}")

    def _ungroup(self, t: Tensor) -> Tensor:
        """Interleaved rows (theirs) -> the parts one after another (ours)."""
        self._check_rows(t)
        rest = t.shape[1:]
        slices = t.reshape(self.groups, -1, *rest).split([p // self.groups for p in self.parts], dim=1)
        return torch.cat([s.reshape(-1, *rest) for s in slices], dim=0)

    def _group(self, t: Tensor) -> Tensor:
        """The parts one after another (ours) -> interleaved rows (theirs)."""
        self._check_rows(t)
        rest = t.shape[1:]
        slices = [p.reshape(self.groups, -1, *rest) for p in t.split(list(self.parts), dim=0)]
        return torch.cat(slices, dim=1).reshape(t.shape).contiguous()

"""The plugin contract's types: what a component implements or receives, and the model calls.

`hookspecs.py` holds each kind's contract (what its factory takes, what its product must expose:
``CONTRACTS``); this module holds the typed shape of each kind's product, named by
``Contract.interface``, and the few shared types those contracts mention:

- :class:`Norm`, :class:`Activation`, :class:`MLP`, :class:`Attention`: Protocols of built modules.
- :class:`Position`: base class of position encodings, with three optional capabilities.
- :class:`Rotary`: what a rotary position encoding hands to attention once per forward pass.
- :class:`AttentionContext`: everything position-dependent that attention needs, computed once per
  forward pass by the model and shared by all layers, with :class:`Positions`, where its tokens sit.
- :class:`LayerKVCache`: the preallocated key/value storage an attention's ``init_cache`` returns.
- :class:`Sampler`: base class of the sampler chain's steps, and :class:`SamplerFlag`, the
  command-line flag a step may declare.

The implementations this module once held live in their subsystem (gptzoo.moves.MOVES): the whole
model's cache in gptzoo.model.kv_cache, TensorMap in gptzoo.hf.tensor_map, the decoding plan's types
in gptzoo.inference.plan. Importing one of them from here still works, with one
gptzoo.errors.GptzooWarning naming its home.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from gptzoo.moves import moved


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

    Each attention allocates its own cache (``init_cache``); the model and the whole model's cache
    (gptzoo.model.kv_cache.KVCache) ask a layer's cache only for ``max_len`` (how many positions it
    accepts in all) and ``nbytes`` (the memory it holds), so a layer may keep fewer positions (a ring
    buffer of its window) in a cache of its own class.
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

    Contract 4: ``__call__`` may also name the keyword arguments ``real`` and ``generator``, which the
    chain then passes (and only then): ``real`` (B, T) bool is True where ``input_ids`` holds a token
    of the prompt or the generation and False at a batch's left padding (whose positions repeat the
    row's first token), for a step that counts the history (a frequency penalty, DRY, no-repeat
    n-grams); ``generator`` is the generation's seeded torch.Generator (or None), from which a
    stochastic step before the final pick draws (XTC). A step with per-generation state (Mirostat's
    running surprise) defines :meth:`reset`, which the chain calls before each generation.
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

    def reset(self) -> None:
        """Forget what the latest generation left in the step (contract 4); called before each generation."""

    def pick(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Choose one token per row (B,) from the logits (B, V)."""
        raise NotImplementedError


def __getattr__(name: str) -> Any:
    """A name that moved to its subsystem (gptzoo.moves.MOVES), with one GptzooWarning per import."""
    return moved(__name__, name)

"""The whole model's KV cache: every layer's cache (each attention allocates its own,
gptzoo.interfaces.LayerKVCache or a class of its own), how many positions they hold, and where the
next tokens sit (gptzoo.interfaces.Positions, handed to attention through its AttentionContext)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from gptzoo.errors import GptzooError
from gptzoo.interfaces import Attention, LayerKVCache, Positions


def _takes_two(method: Callable[..., object]) -> bool:
    """Whether ``method`` accepts two positional arguments (the contract's ``state_bytes(batch_size, dtype)``)."""
    try:
        inspect.signature(method).bind(0, torch.float32)
    except (TypeError, ValueError):
        return False
    return True


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

    @staticmethod
    def state_bytes_needed(attentions: Iterable[Attention], batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """The bytes of those caches that do not grow with the length (each layer's ``state_bytes``, contract 8:
        a recurrent or convolutional mixer's state; none for a layer without it), allocating nothing.

        Raises:
            GptzooError: a layer's state_bytes gives anything but a number of bytes from 0 to its kv_bytes.
        """
        total = 0
        for attn in attentions:
            state_bytes = getattr(attn, "state_bytes", None)
            if not callable(state_bytes) or not _takes_two(state_bytes):  # a method of a plugin's own, not this one
                continue
            n = state_bytes(batch_size, dtype)
            whole = attn.kv_bytes(batch_size, max_len, dtype)
            if type(n) is not int or not 0 <= n <= whole:
                shown = repr(n) if type(n) in (int, float, bool) else f"an object of type {type(n).__name__}"
                raise GptzooError(
                    f"{type(attn).__name__}.state_bytes({batch_size}, {dtype}) gave {shown}, not a number of bytes "
                    f"from 0 to its kv_bytes ({whole}); fix the attention plugin (gptzoo.hookspecs, "
                    "register_attentions)"
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

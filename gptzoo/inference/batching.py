"""Rows of KV caches gathered into one batch: what continuous batching (gptzoo.inference.engine) needs to
know about a layer cache's class, keyed by the class.

A batch's rows hold sequences of different lengths, each right-aligned: row i's tokens are the last
``n_i`` positions before the batch's length L = max n_i, the earlier ones padding (the whole model's
cache marks them in ``key_mask`` and keeps each row's next position, as for left-padded prompts).
When a sequence joins or leaves, :func:`gather` makes the next batch's cache from the rows of the old
batch and of the newcomers' own caches, and so also drops the padding no row needs any more.

Moving a row's positions is the one thing a batch needs from a layer cache, and how depends on where
the cache keeps a position: :data:`MOVERS` knows the built-in caches by class (rows of a
gptzoo.class_table that reach their exact class only), and a plugin tells it of its own with the
``register_cache_rows`` hook (gptzoo.inference.hooks). A model with a layer cache of another
class is served one sequence at a time (:func:`unbatchable` says why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptzoo.class_table import ClassTable
from gptzoo.class_table import Row as TableRow
from gptzoo.errors import PluginError, exception_text
from gptzoo.inference.hooks import CACHE_ROWS
from gptzoo.model.kv_cache import KVCache
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Provenance, Registry, class_key

Mover = Callable[[Any, int, int, Any, int, int, int], None]
"""``move(dst, i, dst_end, src, j, src_end, n)``: the ``n`` positions of ``src``'s row ``j`` that end
before index ``src_end`` become those of ``dst``'s row ``i`` that end before ``dst_end``."""


def _dense(dst: Any, i: int, dst_end: int, src: Any, j: int, src_end: int, n: int) -> None:
    """gptzoo.interfaces.LayerKVCache: keys and values (B, nkv, max_len, hs), position p at index p."""
    dst.k[i, :, dst_end - n : dst_end] = src.k[j, :, src_end - n : src_end]
    dst.v[i, :, dst_end - n : dst_end] = src.v[j, :, src_end - n : src_end]


def _ring(dst: Any, i: int, dst_end: int, src: Any, j: int, src_end: int, n: int) -> None:
    """A ring buffer of the last ``window`` positions (B, nkv, window, hs), position p at slot p % window."""
    keep = min(n, src.k.shape[2], dst.k.shape[2])  # each ring as long as its window or its cache
    source = torch.arange(src_end - keep, src_end, device=src.k.device) % src.k.shape[2]
    target = torch.arange(dst_end - keep, dst_end, device=dst.k.device) % dst.k.shape[2]
    for name in ("k", "v"):
        getattr(dst, name)[i].index_copy_(1, target, getattr(src, name)[j].index_select(1, source))


def _state(dst: Any, i: int, dst_end: int, src: Any, j: int, src_end: int, n: int) -> None:
    """A constant-size state (B, ...): what a sequence's tokens so far left, whichever positions they sit at."""
    dst.state[i] = src.state[j]


def _recurrent(dst: Any, i: int, dst_end: int, src: Any, j: int, src_end: int, n: int) -> None:
    """A recurrent mixer's cache: its convolution's last inputs and its state, both of constant size."""
    dst.conv[i] = src.conv[j]
    dst.state[i] = src.state[j]


def _latent(dst: Any, i: int, dst_end: int, src: Any, j: int, src_end: int, n: int) -> None:
    """A latent attention's cache: latents (B, max_len, rank) and rotated keys (B, 1, max_len, rope_dim)."""
    dst.latent[i, dst_end - n : dst_end] = src.latent[j, src_end - n : src_end]
    dst.k_rope[i, :, dst_end - n : dst_end] = src.k_rope[j, :, src_end - n : src_end]


BUILTIN = Provenance("gptzoo.inference.batching", "gptzoo", gptzoo_version())

MOVERS: tuple[TableRow, ...] = tuple(
    TableRow(key, "", move, BUILTIN)
    for key, move in {
        "gptzoo.interfaces:LayerKVCache": _dense,
        "gptzoo_plugins._attentions:WindowKVCache": _ring,
        "gptzoo_plugins._mla:LatentKVCache": _latent,
        "gptzoo_plugins._short_conv:ConvState": _state,
        "gptzoo_plugins._recurrent:RecurrentState": _recurrent,
    }.items()
)
"""The built-in layer cache classes (each the exact class: a subclass may keep positions elsewhere) and
how a row's positions move between caches of that class."""


def movers(registry: Registry | None = None) -> ClassTable:
    """The built-in :data:`MOVERS`, and those the plugins of ``registry`` register (gptzoo.class_table)."""
    return ClassTable.of(CACHE_ROWS, MOVERS, registry)


def unbatchable(cache: KVCache, registry: Registry | None = None) -> str | None:
    """Why sequences of this model cannot share a batch (a layer cache class no mover knows); None: they can."""
    known = movers(registry)
    for layer in cache.layers:
        if known.find(type(layer)) is None:
            return (
                f"its layer cache {class_key(type(layer))} is not one continuous batching knows how to move rows of (a "
                "plugin tells it with the register_cache_rows hook)"
            )
    return None


@dataclass(frozen=True)
class Row:
    """A sequence in a cache: row ``index`` of ``cache``, whose last ``length`` positions are its tokens."""

    cache: KVCache
    index: int
    length: int


def gather(model: Any, rows: Sequence[Row], capacity: int, registry: Registry | None = None) -> KVCache:
    """A new cache of ``rows`` (in that order), each right-aligned, with room for ``capacity`` positions.

    Each row's positions count from 0 (a sequence starts at the beginning of its prompt); where all rows
    are as long, the cache is a plain one (no ``key_mask``), as a lone sequence's is.
    """
    longest = max(row.length for row in rows)
    known = movers(registry)
    cache = model.init_cache(len(rows), capacity)
    for layer, target in enumerate(cache.layers):
        for value in vars(target).values():
            if isinstance(value, torch.Tensor):  # padding positions are masked, but must not be NaN
                value.zero_()
        key = class_key(type(target))
        match = known.find(type(target))
        assert match is not None, key  # unbatchable() said it is
        move = known.value(match.row, "mover", PluginError)
        for i, row in enumerate(rows):
            try:
                move(target, i, longest, row.cache.layers[layer], row.index, row.cache.length, row.length)
            except Exception as exc:  # a plugin's mover: say whose
                raise PluginError(
                    f"moving a sequence's positions in a {key} (register_cache_rows) failed: {exception_text(exc)}"
                ) from exc
    cache.length = longest
    if any(row.length != longest for row in rows):
        device = model.wte.weight.device
        cache.key_mask = torch.zeros(len(rows), cache.max_len, dtype=torch.bool, device=device)
        for i, row in enumerate(rows):
            cache.key_mask[i, longest - row.length : longest] = True
        cache.next_position = torch.tensor([[row.length] for row in rows], device=device)
    return cache

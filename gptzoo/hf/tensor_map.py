"""How one of a component's tensors is stored in another checkpoint layout (:class:`TensorMap`):
what a Hugging Face layout's ``weights(module)`` returns (the ``register_hf_layouts`` hook,
gptzoo.hf.layouts), converting in both directions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TensorMap:
    """One tensor of ours and the tensor(s) another layout stores it as, names relative to the
    component. Several tensors of theirs are concatenated along dim 0 in the order given (q, k, v
    -> c_attn); ``groups`` is for a layout that interleaves the parts of a tensor (GPT-NeoX keeps the
    q, k and v rows of each head together); ``transpose`` is for layouts that store a linear weight
    as [in, out] (GPT-2's Conv1D); ``stack`` is for a layout that stacks the same tensor of several
    modules into one (the experts of a layer as one 3-D tensor): ours is one slice of theirs. The same
    description converts in both directions.
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
    c_attn (parts (nh hs, nh hs, nh hs)) in nh groups. With ``transpose``, theirs interleaves its
    columns (gpt-oss's gate_up_proj [in, 2 ff] holds gate and up columns alternately). 1: no interleaving."""
    stack: int = 0
    """Theirs (one tensor) stacks ``stack`` tensors along a new dim 0, and ours is the one at ``index``:
    :meth:`load` and :meth:`save` convert that slice (:meth:`select` takes it from the stacked tensor,
    :func:`stack_slices` stacks the saved slices). 0: not stacked."""
    index: int = 0
    """With ``stack``: which slice of theirs ours is."""

    def __post_init__(self) -> None:
        if len(self.theirs) > 1 and (self.transpose or len(self.sizes) != len(self.theirs)):
            raise ValueError(f"{self.ours}: a map to several tensors needs one size each and no transpose")
        if self.groups < 1 or (self.groups > 1) != bool(self.parts):
            raise ValueError(f"{self.ours}: groups={self.groups} needs parts (and parts need groups > 1)")
        if self.groups > 1 and any(p % self.groups for p in self.parts):
            raise ValueError(
                f"{self.ours}: each of parts {self.parts} must split into groups={self.groups} equal slices"
            )
        if self.stack and (len(self.theirs) > 1 or not 0 <= self.index < self.stack):
            raise ValueError(f"{self.ours}: a slice of one stacked tensor needs 0 <= index < stack={self.stack}")

    def load(self, tensors: Sequence[Tensor]) -> Tensor:
        """Their tensors (with ``stack``: the slice :meth:`select` took) -> ours."""
        t = torch.cat(list(tensors), dim=0) if len(tensors) > 1 else tensors[0]
        if self.transpose:
            t = t.t().contiguous()
        return self._ungroup(t) if self.groups > 1 else t

    def save(self, t: Tensor) -> list[Tensor]:
        """Ours -> their tensors (with ``stack``: the slice at ``index``)."""
        if self.groups > 1:
            t = self._group(t)
        if len(self.theirs) > 1:
            return [part.contiguous() for part in t.split(list(self.sizes), dim=0)]
        return [t.t().contiguous() if self.transpose else t]

    def select(self, t: Tensor) -> Tensor:
        """Ours' slice of their stored tensor (the tensor itself when it is not stacked)."""
        return t[self.index] if self.stack else t

    def shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The shapes of their stored tensors for ours of ``shape`` (a stacked one whole)."""
        saved = [tuple(t.shape) for t in self.save(torch.empty(shape, device="meta"))]
        return [(self.stack, *s) for s in saved] if self.stack else saved

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


def stack_slices(rows: Sequence[tuple[TensorMap, str, Tensor]]) -> dict[str, Tensor]:
    """Their tensors from (map, their key, what the map saved) rows: a stacked tensor from the slices
    its maps saved, in index order; ValueError naming a stacked tensor whose slices are not all given."""
    tensors: dict[str, Tensor] = {}
    slices: dict[str, list[Tensor | None]] = {}
    for tmap, key, t in rows:
        if tmap.stack:
            slices.setdefault(key, [None] * tmap.stack)[tmap.index] = t
        else:
            tensors[key] = t
    for key, parts in slices.items():
        missing = [i for i, part in enumerate(parts) if part is None]
        if missing:
            raise ValueError(f"{key}: no map gives its slices {missing}")
        tensors[key] = torch.stack([part for part in parts if part is not None])
    return tensors

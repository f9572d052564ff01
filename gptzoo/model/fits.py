"""Whether a model fits: its float32 weights held against the device's free memory while it is
assembled there, once, so that a model that cannot fit is refused early without a second build.

A :class:`Budget` counts the bytes of every parameter and buffer registered while it counts (torch's
module registration hooks), as the builder assembles the model on a real device. Between components,
and after each block with the blocks still to come projected from the first one of their layer type,
the builder asks :meth:`Budget.check`: a count over the free memory computes the model's exact
total from a structure on the meta device (allocating nothing), and refuses the model when that
exceeds the free memory; otherwise the count was a projection that overshot, and assembly goes on
unchecked. The exact total of a recipe already built on the meta device is remembered (:data:`TOTALS`)
and used instead. An allocator's out-of-memory error during assembly is the same refusal
(:func:`out_of_memory`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from gptzoo.errors import GptzooError
from gptzoo.memory import format_bytes

FIX = (
    "make the model smaller (n_layer, n_embd, d_ff, vocab_size, context_length) or summarize it without --out "
    "(gptzoo build works on the meta device)"
)


def float32_bytes(model: nn.Module) -> int:
    """What the model's parameters and buffers take in float32 (a shared tensor counted once)."""
    return sum(t.numel() * 4 for t in (*model.parameters(), *model.buffers()))


def too_large(name: str, device: torch.device, need: int, free: int | None) -> GptzooError:
    """The refusal of recipe ``name``, whose float32 weights take ``need`` bytes, on ``device``
    with ``free`` bytes free (None: the allocator ran out of memory, and the free memory does not say why)."""
    room = f"and {format_bytes(free)} is free" if free is not None else "more than the allocator could give"
    return GptzooError(f"recipe {name!r} needs {format_bytes(need)} for its float32 weights on {device}, {room}; {FIX}")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc``, or what it was raised from (a PluginError from a factory's), is an allocator's
    out-of-memory error: torch's (CUDA and the like), or the CPU allocator's RuntimeError."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(seen, RuntimeError) and "can't allocate memory" in str(seen):
            return True
        seen = seen.__cause__
    return False


class Totals:
    """The float32 totals of the recipes built on the meta device, by Recipe object and registry while
    both live: the memory check of a build that follows (``gptzoo build --out``: the summary's structure,
    then the checkpoint's weights) takes its exact total from there rather than from another structure."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], int] = {}

    def remember(self, recipe: object, registry: object, total: int) -> None:
        key = (id(recipe), id(registry))
        if key not in self._known:
            for owner in (recipe, registry):  # an id is reused once its object is gone
                weakref.finalize(owner, self._known.pop, key, None)
        self._known[key] = total

    def get(self, recipe: object, registry: object) -> int | None:
        return self._known.get((id(recipe), id(registry)))


TOTALS = Totals()


class Budget:
    """The float32 bytes of the tensors registered in this thread while :meth:`counting`, against
    ``free`` (None: unknown, nothing is refused); ``need`` gives the model's exact total when the
    count goes over, and ``name`` and ``device`` say whose it is."""

    def __init__(self, name: str, device: torch.device, free: int | None, need: Callable[[], int]) -> None:
        self.name, self.device, self.free, self.need = name, device, free, need
        self.total = 0
        self._seen: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._thread = threading.get_ident()

    @contextmanager
    def counting(self) -> Iterator[Budget]:
        hooks = [
            nn.modules.module.register_module_parameter_registration_hook(self._registered),
            nn.modules.module.register_module_buffer_registration_hook(self._registered),
        ]
        try:
            yield self
        finally:
            for hook in hooks:
                hook.remove()

    def _registered(self, module: nn.Module, name: str, tensor: torch.Tensor | None) -> None:
        if tensor is None or tensor.is_meta or threading.get_ident() != self._thread:
            return
        if self._seen.get(id(tensor)) is tensor:  # registered twice: a tied weight
            return
        self._seen[id(tensor)] = tensor
        self.total += tensor.numel() * 4

    def check(self, ahead: int = 0) -> None:
        """Refuse the model if what is counted, and ``ahead`` bytes still to come, exceed the free
        memory and its exact total does too; once the exact total fits, check nothing more."""
        if self.free is None or self.total + ahead <= self.free:
            return
        need = self.need()
        if need > self.free:
            raise too_large(self.name, self.device, need, self.free)
        self.free = None

"""Where each component's tensors and config.json fields go in a Hugging Face layout, keyed by class.

A layout ("gpt2", "llama", "gpt_neox", "phi3": gptzoo.hf.family.Family.layout) is how a family names
and stores its parts. Each component class with an equivalent there has one row in a
gptzoo.class_table (its facet the layout) holding a :class:`gptzoo.hf.hooks.HFLayout`: a function
giving its tensor maps (gptzoo.hf.tensor_map.TensorMap), one giving the config.json fields it owns, and
the nested components mapped with their own layouts. The built-ins' are written beside their family
(hf/gpt2.py holds the "gpt2" layout of every built-in, hf/llama.py the "llama" one, ...), keyed by
reference so that this package imports no component and no component names a family; a plugin adds its
own through the ``register_hf_layouts`` hook (gptzoo.hf.hooks), and may replace a built-in's with
``override=True``.

A module's layout is that of its class, else of its nearest base class that has one (in MRO order), else
the one of the layout it extends, if any (Mixtral's is Llama's but for its experts: ``Family.extends``). A
class that answers for itself with the methods of contract 1, ``hf_weights(layout)`` and
``hf_config(layout)``, is read through them, with one GptzooWarning per class.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from gptzoo.class_table import ClassTable, Row
from gptzoo.errors import GptzooWarning
from gptzoo.hf.hooks import HF_LAYOUTS, HFLayout
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Provenance, Registry, class_key

BUILTIN = Provenance("gptzoo.hf", "gptzoo", gptzoo_version())
"""Who the built-in layouts come from."""


def builtin(
    component: str,
    layout: str,
    weights: Callable[[Any], list[TensorMap] | None],
    config: Callable[[Any], dict[str, Any] | None] | None = None,
    children: tuple[str | tuple[str, str], ...] = (),
) -> Row:
    """A built-in component's layout; ``component`` is its reference ``"module:Class"``."""
    return Row(component, layout, HFLayout(weights, config, children), BUILTIN)


def same(*names: str) -> list[TensorMap]:
    """Tensors stored as they are, under the same names on both sides."""
    return [TensorMap(name, (name,)) for name in names]


_warned: set[type] = set()


class Layouts:
    """One layout's table: the family's built-in rows, then what the registry's plugins registered for it
    (a plugin's row for a class gptzoo has one for is used with ``override=True``; without, gptzoo's is,
    with a warning)."""

    def __init__(self, layout: str, builtins: Iterable[Row], registry: Registry, base: Layouts | None = None) -> None:
        self.layout, self.base = layout, base
        self.table = ClassTable.of(HF_LAYOUTS, builtins, registry)
        for (name, facet), row in self.table.conflicts.items():
            if facet == layout:
                warnings.warn(
                    f"{row.provenance} registers the Hugging Face {layout!r} layout of {name}, which gptzoo has "
                    "already; gptzoo's is used (register it with override=True to replace it)",
                    GptzooWarning,
                    stacklevel=2,
                )

    def find(self, module: nn.Module) -> HFLayout | None:
        """The layout of the module's class or of its nearest base class that has one, else the one the
        layout this one extends (``base``) finds; None if none has."""
        match = self.table.find(type(module), self.layout, legacy=self._contract_1)
        if match is not None:
            return match.row.value
        return self.base.find(module) if self.base is not None else None

    def _contract_1(self, cls: type) -> Row | None:
        """A layout read through the class's own ``hf_weights`` / ``hf_config`` methods (contract 1)."""
        if "hf_weights" not in vars(cls):
            return None
        if cls not in _warned:
            _warned.add(cls)
            warnings.warn(
                f"{class_key(cls)} answers for its Hugging Face layouts with hf_weights/hf_config methods, the "
                "plugin contract before version 2; register them with the register_hf_layouts hook instead "
                "(docs/plugins.md, 'Hugging Face layouts')",
                GptzooWarning,
                stacklevel=3,
            )
        layout = self.layout

        def weights(module: nn.Module) -> list[TensorMap] | None:
            method = getattr(module, "hf_weights", None)
            return method(layout) if method is not None else None

        def config(module: nn.Module) -> dict[str, Any] | None:
            method = getattr(module, "hf_config", None)
            return method(layout) if method is not None else {}

        return Row(class_key(cls), layout, HFLayout(weights, config), BUILTIN)

    def weights(self, module: nn.Module) -> list[TensorMap] | str:
        """The module's maps with those of its children, or why it has no equivalent here."""
        found = self.find(module)
        if found is None:
            return f"it has no {self.layout!r} layout"
        maps = found.weights(module)
        if maps is None:
            return f"its {self.layout!r} layout refuses its parameters"
        maps = list(maps)
        for name in found.children:
            ours, theirs = (name, name) if isinstance(name, str) else name
            child = getattr(module, ours, None)
            if child is None:
                continue
            inner = self.weights(child)
            if isinstance(inner, str):
                return f"its {ours}: {inner}"
            maps += [
                dataclasses.replace(m, ours=f"{ours}.{m.ours}", theirs=tuple(f"{theirs}.{t}" for t in m.theirs))
                for m in inner
            ]
        return maps

    def children(self, module: nn.Module) -> list[nn.Module]:
        """The modules its layout maps as its children (an attention's q/k norms), which that layout describes."""
        found = self.find(module)
        names = found.children if found is not None else ()
        found_children = (getattr(module, name if isinstance(name, str) else name[0], None) for name in names)
        return [child for child in found_children if child is not None]

    def config(self, module: nn.Module) -> dict[str, Any] | None:
        """The config.json fields the module owns here ({} without a config function), None: no equivalent."""
        found = self.find(module)
        if found is None or found.config is None:
            return {}
        return found.config(module)

"""The adapters subsystem's hook: how a plugin names the parts of a component's fused projections, so
that low-rank adapters can target each part (gptzoo.adapters.targets reads the table it fills). The plugin
manager adds the hook spec and its :class:`gptzoo.class_table.Intake` (gptzoo.plugin_manager.SUBSYSTEMS).

This module imports no torch: the plugin manager loads it for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gptzoo.class_table import Accepted, Intake
from gptzoo.errors import RegistryError
from gptzoo.hookspecs import hookspec
from gptzoo.registry import Provenance, show_plain


class RegisterAdapterParts(Protocol):
    def __call__(
        self, component: type | str, parts: dict[str, Callable[[Any], Any]], *, override: bool = False
    ) -> None: ...


@hookspec
def register_adapter_parts(register: RegisterAdapterParts) -> None:
    """Name the parts of a component's fused projections, so that low-rank adapters can target each part
    (contract 6; gptzoo.adapters.targets).

    Every plain ``nn.Linear`` inside a block's component is a target without this hook, named by its
    attribute path (``attn.q_a``, ``mlp.experts.c_fc`` for that projection of every expert). A projection
    that computes several things at once (q, k and v in one matrix) may be split into named row ranges:

    ``register(component, parts, *, override=False)``:
        component: the class that owns the projections (a subclass uses its nearest base class's), or
            its reference ``"module:Class"``.
        parts: attribute name -> ``split(module) -> [(name, rows), ...]``, the parts of that projection
            in row order, their rows adding up to its out_features (-1: the rest of them), e.g.
            ``{"c_attn": lambda a: [("q", a.n_head * a.head_dim), ("kv", -1)], "c_proj": lambda a: [("o", -1)]}``.
        override: replace the split gptzoo, or another plugin, gives the same attribute of the class
            (contract 7; a plugin written for an earlier contract replaces it without).

    A split whose rows do not add up is refused, naming the class, when a model is adapted.
    """


def _parts(provenance: Provenance, key: str, parts: dict[str, Callable[[Any], Any]]) -> Accepted:
    if not isinstance(parts, dict) or not all(
        isinstance(k, str) and k.isidentifier() and callable(v) for k, v in parts.items()
    ):
        raise RegistryError(
            f"{provenance} registered adapter parts for {key} that are not {{attribute: split function}}: "
            f"{show_plain(parts)}"
        )
    return [(str.__str__(attribute), split, ()) for attribute, split in parts.items()]


ADAPTER_PARTS = Intake(
    "register_adapter_parts",
    "adapter parts",
    _parts,
    lambda key, facet: f"adapter parts of {key}.{facet}",
    replaced_before=7,
)
INTAKES = (ADAPTER_PARTS,)
"""This subsystem's intakes, read by the plugin manager."""

"""The Hugging Face subsystem's hook: where a plugin's component classes keep their tensors and config.json
fields in each Hugging Face layout (gptzoo.hf.layouts reads the table it fills). The plugin manager adds
the hook spec and its :class:`gptzoo.class_table.Intake` (gptzoo.plugin_manager.SUBSYSTEMS).

This module imports no torch: the plugin manager loads it for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gptzoo.class_table import Accepted, Intake
from gptzoo.errors import RegistryError
from gptzoo.hookspecs import hookspec
from gptzoo.registry import NAME, Provenance, show_plain


class RegisterHFLayout(Protocol):
    def __call__(
        self,
        component: type | str,
        layout: str,
        *,
        weights: Callable[[Any], Any],
        config: Callable[[Any], Any] | None = None,
        children: tuple[str | tuple[str, str], ...] = (),
        override: bool = False,
    ) -> None: ...


@hookspec
def register_hf_layouts(register: RegisterHFLayout) -> None:
    """Register where a component's tensors and config.json fields go in a Hugging Face layout, so that
    models holding it import from and export to that layout's families (gptzoo.hf.layouts).

    ``register(component, layout, *, weights, config=None, children=(), override=False)``:
        component: the component's class, or its reference ``"module:Class"``; a subclass without a
            layout of its own uses its nearest base class's.
        layout: how a family names and stores its parts (gptzoo.hf.family.Family.layout): "gpt2", "llama"
            (LlamaForCausalLM and the families stored as it is: Gemma 2 and 3, Qwen2 and 3, Mistral,
            OLMo 2), "gpt_neox", "phi3", and the mixtures' own ("mixtral", "deepseek_v2", ...), which
            extend "llama"; docs/plugins.md lists every family's.
        weights: ``weights(module) -> list[TensorMap] | None``: where each tensor of the module's state
            dict lives, relative to the component's place in the checkpoint (gptzoo.hf.tensor_map.TensorMap);
            the maps must cover the state dict exactly (the conformance kit checks it), and None means
            that these parameters have no equivalent there (import and export then refuse it by name).
        config: ``config(module) -> dict | None``: the config.json fields the component owns (e.g.
            ``{"rms_norm_eps": 1e-6}``; a value may be an object of plain values, as ``rope_scaling``),
            every feature that changes its math among them, so that a family without that field refuses
            it; None: no equivalent. Default: no fields.
        children: attributes holding nested components (an attention's q/k norms) whose own layouts map
            their tensors: a name, the same on both sides, or a pair ``(ours, theirs)`` when the layout
            stores the component under another name (``("kv_norm", "kv_a_layernorm")``).
        override: replace the layout another plugin, or gptzoo itself, gives the same class.

    A plugin may register layouts for any class, its own or another's. Before contract 2 a component
    answered for itself with ``hf_weights(layout)`` and ``hf_config(layout)`` methods: those still work,
    with one GptzooWarning per class.
    """


@dataclass(frozen=True)
class HFLayout:
    """Where one component class's tensors and config.json fields go in one Hugging Face layout: the
    value of its row (gptzoo.class_table.Row, the layout its facet)."""

    weights: Callable[[Any], Any]
    """``weights(module) -> list[TensorMap] | None``: None when these parameters have no equivalent there."""
    config: Callable[[Any], Any] | None
    """``config(module) -> dict | None``: the config.json fields the component owns (None: no equivalent)."""
    children: tuple[str | tuple[str, str], ...] = ()
    """Nested components (attributes) whose own layouts map their tensors: a name, the same on both sides,
    or (ours, theirs) when the layout stores it under another name."""


def _child_name(child: object) -> bool:
    """A layout's child: an attribute name, or a pair (ours, theirs) of names."""
    if isinstance(child, str):
        return child.isidentifier()
    return (
        isinstance(child, (tuple, list))
        and len(child) == 2
        and all(isinstance(c, str) and c.isidentifier() for c in child)
    )


def _layout(
    provenance: Provenance,
    key: str,
    layout: str,
    *,
    weights: Callable[[Any], Any],
    config: Callable[[Any], Any] | None = None,
    children: tuple[str | tuple[str, str], ...] | list[str | tuple[str, str]] = (),
) -> Accepted:
    what = f"{provenance} registered a Hugging Face layout"
    if not isinstance(layout, str) or not NAME.fullmatch(layout):
        raise RegistryError(f"{what} with a layout that is not a name: {show_plain(layout)}; e.g. 'llama'")
    for name, value, may_be_none in (("weights", weights, False), ("config", config, True)):
        if not callable(value) and not (may_be_none and value is None):
            raise RegistryError(
                f"{what} ({layout!r}) whose {name} is not callable: {show_plain(value)}; pass a function of the "
                "component"
            )
    if isinstance(children, str) or not all(_child_name(c) for c in children):
        raise RegistryError(
            f"{what} ({layout!r}) whose children are not attribute names: {show_plain(children)}; pass a tuple "
            "of them, each a name or a pair (ours, theirs) of names"
        )
    named = tuple(c if isinstance(c, str) else (c[0], c[1]) for c in children)
    return [(str.__str__(layout), HFLayout(weights, config, named), ())]


HF_LAYOUTS = Intake(
    "register_hf_layouts",
    "a Hugging Face layout",
    _layout,
    lambda key, facet: f"Hugging Face {facet!r} layout of {key}",
)
INTAKES = (HF_LAYOUTS,)
"""This subsystem's intakes, read by the plugin manager."""

"""Assembly: a validated Recipe -> registry lookups -> component factories -> GPT.

This is the only place that turns component names into modules; the model never sees names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptzoo.model.gpt import BLOCKS, GPT
from gptzoo.recipe import COMPONENT_KEYS, Component, Recipe, load_recipe, structural_args
from gptzoo.registry import Entry, Registry, default_registry


def resolve_components(recipe: Recipe, registry: Registry) -> dict[str, Entry]:
    """The registry entry of each component of the recipe, by [model] key (= kind)."""
    return {kind: registry.get(kind, getattr(recipe.model, kind).name) for kind in COMPONENT_KEYS}


def build_model(
    recipe: Recipe | str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
) -> GPT:
    """Build a model from a recipe (or a recipe name or path).

    On the meta device nothing is allocated or initialized (for summaries and for loading weights
    later); elsewhere the weights get GPT-2's initialization in float32, then are cast to ``dtype``.
    """
    registry = registry if registry is not None else default_registry()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, registry=registry)
    spec = recipe.model
    entries = resolve_components(recipe, registry)

    def make(kind: str, **extra: Any) -> nn.Module:
        component: Component = getattr(spec, kind)
        return entries[kind].factory(**structural_args(spec, kind), **extra, **component.kwargs)

    block_cls = BLOCKS[spec.norm_placement]
    device = torch.device(device) if device is not None else torch.get_default_device()
    with device:
        blocks = [
            block_cls(
                ln_1=make("norm"),
                attn=make("attention"),
                ln_2=make("norm"),
                mlp=make("mlp", activation=make("activation")),
            )
            for _ in range(spec.n_layer)
        ]
        model = GPT(
            vocab_size=spec.vocab_size,
            n_embd=spec.n_embd,
            position=make("position"),
            blocks=blocks,
            ln_f=make("norm") if block_cls.has_final_norm else nn.Identity(),
            tie_embeddings=spec.tie_embeddings,
        )
    if device.type != "meta":
        model.init_weights(spec.init_std)
    if dtype is not None:
        model.to(dtype)
    model.recipe = recipe
    return model

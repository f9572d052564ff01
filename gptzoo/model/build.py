"""Assembly: a validated Recipe -> the entries validation resolved -> component factories -> GPT.

This is the only place that turns component names into modules; the model never sees names.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptzoo.errors import GptzooError
from gptzoo.hookspecs import CONTRACTS
from gptzoo.interfaces import Position
from gptzoo.memory import available_bytes
from gptzoo.model import fits
from gptzoo.model.gpt import BLOCKS, GPT
from gptzoo.plugin_code import build, check_contract, running, takes
from gptzoo.recipe import Recipe, entry_of, load_recipe, structural_args
from gptzoo.recipe.schema import LayerType
from gptzoo.registry import Entry, Registry, default_registry


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
    A model whose float32 weights do not fit in the device's free memory is refused as soon as its one
    assembly there shows it (gptzoo.model.fits), before its weights are initialized.
    Every component is checked against its kind's contract (gptzoo.hookspecs.CONTRACTS): a factory
    that raises (or exits), or whose first product lacks a required member, has one of another type
    than its interface declares, or holds a parameter or persistent buffer of a dtype no checkpoint
    holds (integers, float64), is a PluginError naming its plugin (gptzoo.plugin_code).
    """
    registry = registry if registry is not None else default_registry()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, registry=registry)
    device = torch.device(device) if device is not None else torch.get_default_device()
    built: list[tuple[Entry, nn.Module]] = []
    if device.type == "meta":
        model = assemble(recipe, registry, device, built)
        fits.TOTALS.remember(recipe, registry, fits.float32_bytes(model))
    else:
        model = assemble_within_memory(recipe, registry, device, built)
        owner = {id(module): entry for entry, module in built}

        def reset(module: nn.Module) -> None:
            with running(owner[id(module)], "failed to reset its parameters"):
                module.reset_parameters()

        model.init_weights(recipe.model.init_std, components=[module for _, module in built], reset=reset)
    if dtype is not None:
        model.to(dtype)
    model.recipe = recipe
    model.registry = registry
    return model


def assemble_within_memory(
    recipe: Recipe, registry: Registry, device: torch.device, built: list[tuple[Entry, nn.Module]]
) -> GPT:
    """:func:`assemble` on a real device, refused (gptzoo.model.fits.too_large) as soon as its
    float32 weights exceed the free memory, or when the allocator runs out of it."""

    def need() -> int:  # the exact total: that of the recipe's meta structure, built before or now
        known = fits.TOTALS.get(recipe, registry)
        if known is not None:
            return known
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # draws no random number
            return fits.float32_bytes(assemble(recipe, registry, torch.device("meta")))

    budget = fits.Budget(recipe.name, device, available_bytes(device), need)
    try:
        with budget.counting():
            return assemble(recipe, registry, device, built, budget)
    except Exception as exc:
        if not fits.out_of_memory(exc):
            raise
        total, free = need(), available_bytes(device)
        raise fits.too_large(recipe.name, device, total, free if free is not None and total > free else None) from exc


def assemble(
    recipe: Recipe,
    registry: Registry,
    device: torch.device,
    built: list[tuple[Entry, nn.Module]] | None = None,
    budget: fits.Budget | None = None,
) -> GPT:
    """The modules of the recipe on ``device``, uninitialized; ``built`` receives each component a
    factory built (nested ones too, such as an mlp's activation) with its entry. Each component's
    entry is the one validation resolved (gptzoo.recipe.validate.entry_of). ``budget`` is checked
    after each component, and after each block with the blocks still to come (each as large as the
    first of its layer type).

    Each block is built from the components of its layer type (``ModelSpec.layer_components``); a
    layer type that changes the position encoding gets a position module of its own, which the
    blocks of that type take their rotary and bias from.
    """
    spec = recipe.model
    checked: set[tuple[str, str]] = set()
    entries: dict[tuple[str, str], Entry] = {}  # by (kind, name): a Recipe made by hand looks each name up once

    def make(kind: str, layer_type: str, **override: Any) -> nn.Module:
        component = spec.layer_components(layer_type)[kind]
        if (kind, component.name) not in entries:
            entries[kind, component.name] = entry_of(kind, component, registry)
        entry = entries[kind, component.name]
        nested = {arg: make(arg, layer_type) for arg in CONTRACTS[kind].components}
        builders = {
            arg: functools.partial(make_at, arg, layer_type) for arg in CONTRACTS[kind].builders if takes(entry, arg)
        }
        args = {**structural_args(spec, kind), **nested, **builders, **component.kwargs, **override}
        module = build(entry, args)
        if (kind, layer_type) not in checked:
            width = args.get(CONTRACTS[kind].structural[0][0]) if CONTRACTS[kind].structural else None
            check_contract(entry, module, width=width)
            checked.add((kind, layer_type))
        if built is not None:
            built.append((entry, module))
        if budget is not None:
            budget.check()
        return module

    def make_at(kind: str, layer_type: str, dim: int, **params: Any) -> nn.Module:
        (arg, _), *_ = CONTRACTS[kind].structural  # the width: a norm's dim
        return make(kind, layer_type, **params, **{arg: dim})

    schedule = spec.schedule()
    with device:
        position = make("position", "")
        own = [
            t for t in dict.fromkeys(schedule) if "position" in dict(spec.layer_types).get(t, LayerType()).overrides()
        ]
        layer_positions = [make("position", t) for t in own]
        for t, module in zip(own, layer_positions, strict=True):
            if type(module).embed is not Position.embed:
                raise GptzooError(
                    f"recipe {recipe.name!r}: [model] layer_types.{t}.position ({type(module).__name__}) adds an "
                    "embedding to the tokens, which only [model] position can (it is added once, below every "
                    "layer); give the layer type a position that only rotates or biases attention"
                )
        kinds = {"attn": "attention", "mlp": "mlp"}  # every other part of a block is a norm
        blocks, sizes, left = [], {}, Counter(schedule)
        for t in schedule:
            before = budget.total if budget is not None else 0
            block_cls = BLOCKS[spec.placement(t)]
            parts = {part: make(kinds.get(part, "norm"), t) for part in block_cls.layout}
            blocks.append(block_cls(**parts, residual_multiplier=spec.residual_multiplier))
            left[t] -= 1
            if budget is not None:
                sizes.setdefault(t, budget.total - before)
                budget.check(ahead=sum(sizes.get(u, 0) * n for u, n in left.items()))
        model = GPT(
            vocab_size=spec.vocab_size,
            n_embd=spec.n_embd,
            position=position,
            blocks=blocks,
            ln_f=make("norm", "") if BLOCKS[spec.norm_placement].has_final_norm else nn.Identity(),
            tie_embeddings=spec.tie_embeddings,
            layer_positions=layer_positions,
            position_of=[own.index(t) + 1 if t in own else 0 for t in schedule],
            scale_embeddings=spec.scale_embeddings,
            logit_softcap=spec.logit_softcap,
            embedding_multiplier=spec.embedding_multiplier,
            logits_scaling=spec.logits_scaling,
        )
    if budget is not None:
        budget.check()
    return model

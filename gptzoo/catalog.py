"""Which shipped recipes use which components: ``gptzoo recipes --uses NAME`` and the "recipes" of
``gptzoo list``, so that a user finds every model that uses a part.

A recipe uses the entry each of its components resolves to, in [model], in every layer type and in
its [generate] sampler chain; a name matches every entry registered under it, in any kind (or the one
entry a qualified ``DIST:name`` means). A recipe is read as TOML data (``extends`` followed) and its
component names are matched against the registry's entries, without the recipe validator: no factory
is read, so the listing runs nothing of a plugin's and imports nothing registered by reference (nor
torch, nor the validator). A recipe one of whose names does not resolve uses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gptzoo.errors import GptzooError, RecipeError, did_you_mean
from gptzoo.plugin_manager import canonical_name
from gptzoo.recipe import read_recipe_data, shipped_recipes
from gptzoo.recipe.schema import COMPONENT_KEYS, LAYER_TYPES, SAMPLERS, merge_component, show
from gptzoo.registry import Entry, Registry, split_name

Use = tuple[str, str]
"""(kind, qualified name): one registry entry."""


@dataclass(frozen=True)
class ShippedRecipe:
    name: str
    uses: frozenset[Use] | None
    """The entries its components resolve to; None when its names do not resolve with the installed
    plugins (``problem`` says why)."""
    problem: str = ""


def named_components(data: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(where, kind, value) of each component that recipe data names: [model]'s, each layer type's
    (a table without a name changes [model]'s component) and each [generate] sampler's."""
    model = data.get("model", {})
    model = model if isinstance(model, dict) else {}
    found = [(f"[model] {key}", key, model[key]) for key in COMPONENT_KEYS if key in model]
    layer_types = model.get(LAYER_TYPES, {})
    for name, table in layer_types.items() if isinstance(layer_types, dict) else ():
        for key, item in table.items() if isinstance(table, dict) else ():
            if key in COMPONENT_KEYS:
                found.append((f"[model] {LAYER_TYPES}.{name}.{key}", key, merge_component(model.get(key), item)))
    generate = data.get("generate", {})
    samplers = generate.get(SAMPLERS, []) if isinstance(generate, dict) else []
    found += [
        (f"[generate] {SAMPLERS}[{i}]", "sampler", v)
        for i, v in enumerate(samplers if isinstance(samplers, list) else [])
    ]
    return found


def uses(data: dict[str, Any], registry: Registry) -> frozenset[Use]:
    """The entries the components of recipe data resolve to.

    Raises:
        GptzooError: a component that is not a name or a table with one, or a name that does not
            resolve (unknown, or ambiguous), with its key path.
    """
    found = set()
    for where, kind, value in named_components(data):
        name = value.get("name") if isinstance(value, dict) else value
        if not isinstance(name, str):
            raise GptzooError(f'{where} must be a component name or a table {{ name = "...", ... }}, got {show(value)}')
        try:
            entry = registry.get(kind, name)
        except GptzooError as exc:
            raise GptzooError(f"{where}: {exc}") from None
        found.add((entry.kind, entry.qualified_name))
    return frozenset(found)


def shipped(registry: Registry) -> list[ShippedRecipe]:
    """Every shipped recipe, its names resolved in ``registry`` (one a plugin breaks is kept with its problem)."""
    recipes = []
    for name, path in shipped_recipes().items():
        try:
            recipes.append(ShippedRecipe(name, uses(read_recipe_data(path), registry)))
        except (RecipeError, GptzooError) as exc:
            recipes.append(ShippedRecipe(name, None, str(exc)))
    return recipes


def named(registry: Registry, name: str) -> set[Use]:
    """The entries ``name`` means in any kind: all of a bare name's, or a qualified name's one.

    Raises:
        GptzooError: no kind has a component of that name (with a did-you-mean over every name).
    """
    dist, bare = split_name(name)
    found = {
        (e.kind, e.qualified_name)
        for e in registry.all_entries()
        if e.name == bare and (dist is None or canonical_name(e.provenance.distribution) == canonical_name(dist))
    }
    if not found:
        every = sorted({e.name for e in registry.all_entries()})
        raise GptzooError(f"no component is named {name!r}{did_you_mean(name, every)}; see `gptzoo list`")
    return found


def recipes_using(registry: Registry, names: Iterable[str], recipes: list[ShippedRecipe]) -> list[ShippedRecipe]:
    """The recipes that use a component of every one of ``names``."""
    wanted = [named(registry, name) for name in names]
    return [r for r in recipes if r.uses is not None and all(r.uses & w for w in wanted)]


def used_by(entry: Entry, recipes: list[ShippedRecipe]) -> list[str]:
    """The names of the shipped recipes that use ``entry``."""
    key = (entry.kind, entry.qualified_name)
    return [r.name for r in recipes if r.uses is not None and key in r.uses]

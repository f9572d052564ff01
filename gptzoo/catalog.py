"""Which shipped recipes use which components: ``gptzoo recipes --uses NAME`` and the "recipes" of
``gptzoo list``, so that a user finds every model that uses a part.

A recipe uses the entry each of its components resolves to, in [model], in every layer type and in
its [generate] sampler chain; a name matches every entry registered under it, in any kind (or the one
entry a qualified ``DIST:name`` means). Recipes are resolved by name only: no factory is read, so the
listing runs nothing of a plugin's and imports nothing registered by reference (nor torch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gptzoo.errors import GptzooError, RecipeError, did_you_mean
from gptzoo.plugin_manager import canonical_name
from gptzoo.recipe import Recipe, read_recipe_data, resolve_components, shipped_recipes, validate
from gptzoo.registry import Entry, Registry, split_name

Use = tuple[str, str]
"""(kind, qualified name): one registry entry."""


@dataclass(frozen=True)
class ShippedRecipe:
    name: str
    recipe: Recipe | None
    """Resolved by name only (gptzoo.recipe.validate's ``names_only``); None when its names do not
    resolve with the installed plugins (``problem`` says why)."""
    problem: str = ""


def uses(recipe: Recipe, registry: Registry) -> set[Use]:
    """The entries the recipe's components resolve to: [model], its layer types and its sampler chain."""
    found = {(entry.kind, entry.qualified_name) for entry, _ in resolve_components(recipe, registry).values()}
    found |= {("sampler", registry.get("sampler", step.name).qualified_name) for step in recipe.generate.samplers}
    return found


def shipped(registry: Registry) -> list[ShippedRecipe]:
    """Every shipped recipe, its names resolved in ``registry`` (one a plugin breaks is kept with its problem)."""
    recipes = []
    for name, path in shipped_recipes().items():
        try:
            recipe = validate(read_recipe_data(path), str(path), name=name, registry=registry, names_only=True)
            recipes.append(ShippedRecipe(name, recipe))
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
    return [r for r in recipes if r.recipe is not None and all(uses(r.recipe, registry) & w for w in wanted)]


def used_by(entry: Entry, registry: Registry, recipes: list[ShippedRecipe]) -> list[str]:
    """The names of the shipped recipes that use ``entry``."""
    key = (entry.kind, entry.qualified_name)
    return [r.name for r in recipes if r.recipe is not None and key in uses(r.recipe, registry)]

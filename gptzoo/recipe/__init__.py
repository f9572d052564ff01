"""Recipes, by job: ``schema`` (the frozen dataclasses and TOML writing), ``load`` (finding a
recipe, ``extends``, ``--set`` overrides), ``validate`` (the one step that consults the registry)
and ``tokenizer`` (the tokenizer a recipe names)."""

from gptzoo.recipe.load import (
    apply_overrides,
    load_recipe,
    override_recipe,
    read_recipe_data,
    resolve_recipe_path,
    shipped_recipes,
)
from gptzoo.recipe.schema import (
    COMPONENT_KEYS,
    Component,
    GenerateSpec,
    ModelSpec,
    Recipe,
    TokenizerSpec,
    TrainSpec,
    WeightsSpec,
    dump_toml,
)
from gptzoo.recipe.tokenizer import recipe_tokenizer
from gptzoo.recipe.validate import resolve_components, structural_args, validate

__all__ = [
    "COMPONENT_KEYS",
    "Component",
    "GenerateSpec",
    "ModelSpec",
    "Recipe",
    "TokenizerSpec",
    "TrainSpec",
    "WeightsSpec",
    "apply_overrides",
    "dump_toml",
    "load_recipe",
    "override_recipe",
    "read_recipe_data",
    "recipe_tokenizer",
    "resolve_components",
    "resolve_recipe_path",
    "shipped_recipes",
    "structural_args",
    "validate",
]

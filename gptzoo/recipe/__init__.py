"""Recipes, by job: ``schema`` (the frozen dataclasses and TOML writing), ``load`` (finding a
recipe, ``extends``, ``--set`` overrides), ``validate`` (the one step that consults the registry)
and ``tokenizer`` (the tokenizer a recipe names).

``validate`` and ``tokenizer`` are imported when one of their names is first used (PEP 562): they
bring the component contracts, numpy and tiktoken, which ``gptzoo --help`` and the listings of
``gptzoo recipes`` do without. ``gptzoo.recipe.validate`` is the function, as it was when this
package imported it eagerly, also once the submodule of that name has been imported.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

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

_LAZY = {
    "recipe_tokenizer": "gptzoo.recipe.tokenizer",
    "entry_of": "gptzoo.recipe.validate",
    "resolve_components": "gptzoo.recipe.validate",
    "structural_args": "gptzoo.recipe.validate",
    "validate": "gptzoo.recipe.validate",
}
"""Name -> the module that defines it, imported on first use."""

if TYPE_CHECKING:
    from gptzoo.recipe.tokenizer import recipe_tokenizer as recipe_tokenizer
    from gptzoo.recipe.validate import entry_of as entry_of
    from gptzoo.recipe.validate import resolve_components as resolve_components
    from gptzoo.recipe.validate import structural_args as structural_args
    from gptzoo.recipe.validate import validate as validate


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):  # the import system binding a submodule
            value = getattr(value, name)  # of a function's name: the name stays the function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


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
    "entry_of",
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

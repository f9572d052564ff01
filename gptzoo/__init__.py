"""gptzoo: a plugin-based component registry and model zoo for GPT-style decoder-only models.

Public API::

    import gptzoo
    recipe = gptzoo.load_recipe("gpt2-small", overrides=["model.n_layer=6"])
    model = gptzoo.build_model(recipe, device="cpu")
    logits = model(idx)  # (B, T) -> (B, T, vocab)

Plugins implement the hooks in gptzoo.hookspecs with ``@gptzoo.hookimpl``.
"""

from gptzoo.build import build_model
from gptzoo.checkpoint import load_checkpoint, save_checkpoint
from gptzoo.errors import (
    CheckpointError,
    GptzooError,
    PluginError,
    RecipeError,
    RegistryError,
    UnknownComponentError,
)
from gptzoo.hookspecs import hookimpl
from gptzoo.model import GPT
from gptzoo.plugins import get_plugin_manager
from gptzoo.recipe import Recipe, load_recipe
from gptzoo.registry import Registry, get_registry

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "CheckpointError",
    "GptzooError",
    "PluginError",
    "Recipe",
    "RecipeError",
    "Registry",
    "RegistryError",
    "UnknownComponentError",
    "build_model",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "load_checkpoint",
    "load_recipe",
    "save_checkpoint",
]

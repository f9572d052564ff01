"""gptzoo: a plugin-based component registry and model zoo for GPT-style decoder-only models.

Public API::

    import gptzoo
    recipe = gptzoo.load_recipe("gpt2-small", overrides=["model.n_layer=6"])
    model = gptzoo.build_model(recipe, device="cpu")
    logits = model(idx)  # (B, T) -> (B, T, vocab)
    loaded = gptzoo.load_model(checkpoint="runs/x/step-100", overrides=["generate.max_new_tokens=20"])

Plugins implement the hooks in gptzoo.hookspecs with ``@gptzoo.hookimpl``.
"""

from gptzoo.errors import (
    CheckpointError,
    GptzooError,
    PluginError,
    RecipeError,
    RegistryError,
    UnknownComponentError,
)
from gptzoo.hookspecs import hookimpl
from gptzoo.inference.generate import generate, generate_text, plan_generation
from gptzoo.loader import Loaded, load_model
from gptzoo.model.build import build_model
from gptzoo.model.checkpoint import load_checkpoint, save_checkpoint
from gptzoo.model.gpt import GPT
from gptzoo.plugin_manager import get_plugin_manager, gptzoo_version
from gptzoo.recipe import Recipe, load_recipe
from gptzoo.registry import Registry, get_registry
from gptzoo.training.data import prepare
from gptzoo.training.trainer import train

__version__ = gptzoo_version()

__all__ = [
    "CheckpointError",
    "GPT",
    "GptzooError",
    "Loaded",
    "PluginError",
    "Recipe",
    "RecipeError",
    "Registry",
    "RegistryError",
    "UnknownComponentError",
    "build_model",
    "generate",
    "generate_text",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "load_checkpoint",
    "load_model",
    "load_recipe",
    "plan_generation",
    "prepare",
    "save_checkpoint",
    "train",
]

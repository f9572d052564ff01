"""gptzoo: a plugin-based component registry and model zoo for GPT-style decoder-only models.

Public API::

    import gptzoo
    recipe = gptzoo.load_recipe("gpt2-small", overrides=["model.n_layer=6"])
    model = gptzoo.build_model(recipe, device="cpu")
    logits = model(idx)  # (B, T) -> (B, T, vocab)
    loaded = gptzoo.load_model(checkpoint="runs/x/step-100", overrides=["generate.max_new_tokens=20"])

Plugins implement the hooks in gptzoo.hookspecs with ``@gptzoo.hookimpl``, against the plugin contract
``gptzoo.CONTRACT_VERSION``.

Names are imported when first used (PEP 562), so ``import gptzoo`` is quick and does not import
torch: a plugin module that only needs ``gptzoo.hookimpl`` stays light, and the command line can
answer Ctrl-C while torch is still loading.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = {
    "CONTRACT_VERSION": "gptzoo.hookspecs",
    "CheckpointError": "gptzoo.errors",
    "GptzooError": "gptzoo.errors",
    "GptzooWarning": "gptzoo.errors",
    "PluginError": "gptzoo.errors",
    "RecipeError": "gptzoo.errors",
    "RegistryError": "gptzoo.errors",
    "UnknownComponentError": "gptzoo.errors",
    "hookimpl": "gptzoo.hookspecs",
    "generate": "gptzoo.inference.generate",
    "generate_text": "gptzoo.inference.generate",
    "plan_generation": "gptzoo.inference.generate",
    "Loaded": "gptzoo.loader",
    "build": "gptzoo.loader",
    "load_any": "gptzoo.loader",
    "load_model": "gptzoo.loader",
    "quantize_model": "gptzoo.loader",
    "build_model": "gptzoo.model.build",
    "load_checkpoint": "gptzoo.model.checkpoint",
    "save_checkpoint": "gptzoo.model.checkpoint",
    "GPT": "gptzoo.model.gpt",
    "get_plugin_manager": "gptzoo.plugin_manager",
    "gptzoo_version": "gptzoo.plugin_manager",
    "Recipe": "gptzoo.recipe",
    "load_recipe": "gptzoo.recipe",
    "Registry": "gptzoo.registry",
    "get_registry": "gptzoo.registry",
    "prepare": "gptzoo.training.data",
    "train": "gptzoo.training.trainer",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_API)

if TYPE_CHECKING:  # for type checkers and editors; `as` marks each as re-exported
    from gptzoo.errors import CheckpointError as CheckpointError
    from gptzoo.errors import GptzooError as GptzooError
    from gptzoo.errors import GptzooWarning as GptzooWarning
    from gptzoo.errors import PluginError as PluginError
    from gptzoo.errors import RecipeError as RecipeError
    from gptzoo.errors import RegistryError as RegistryError
    from gptzoo.errors import UnknownComponentError as UnknownComponentError
    from gptzoo.hookspecs import CONTRACT_VERSION as CONTRACT_VERSION
    from gptzoo.hookspecs import hookimpl as hookimpl
    from gptzoo.inference.generate import generate as generate
    from gptzoo.inference.generate import generate_text as generate_text
    from gptzoo.inference.generate import plan_generation as plan_generation
    from gptzoo.loader import Loaded as Loaded
    from gptzoo.loader import build as build
    from gptzoo.loader import load_any as load_any
    from gptzoo.loader import load_model as load_model
    from gptzoo.loader import quantize_model as quantize_model
    from gptzoo.model.build import build_model as build_model
    from gptzoo.model.checkpoint import load_checkpoint as load_checkpoint
    from gptzoo.model.checkpoint import save_checkpoint as save_checkpoint
    from gptzoo.model.gpt import GPT as GPT
    from gptzoo.plugin_manager import get_plugin_manager as get_plugin_manager
    from gptzoo.plugin_manager import gptzoo_version as gptzoo_version
    from gptzoo.recipe import Recipe as Recipe
    from gptzoo.recipe import load_recipe as load_recipe
    from gptzoo.registry import Registry as Registry
    from gptzoo.registry import get_registry as get_registry
    from gptzoo.training.data import prepare as prepare
    from gptzoo.training.trainer import train as train

    __version__: str


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = importlib.import_module("gptzoo.plugin_manager").gptzoo_version()
    elif name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    else:
        try:  # a submodule: gptzoo.registry after a bare `import gptzoo`
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, "__version__"})

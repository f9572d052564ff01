"""gptzoo checkpoints: a directory with model.safetensors and the resolved recipe.toml.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into place
only when complete, so an interrupted save leaves nothing half-written. A tied LM head is not
stored (as in Hugging Face files); loading re-ties it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError
from gptzoo.model.build import build_model
from gptzoo.model.gpt import GPT
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.recipe import Recipe, read_recipe_data, validate

WEIGHTS = "model.safetensors"
RECIPE = "recipe.toml"


def write_files(directory: Path, tensors: dict[str, torch.Tensor], recipe: Recipe) -> None:
    """The checkpoint files (weights and recipe) into ``directory``, which is being written atomically."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt", "gptzoo_version": gptzoo_version()})
    (directory / RECIPE).write_text(recipe.to_toml(), encoding="utf-8")


def read_recipe(path: Path) -> Recipe:
    """The resolved recipe a checkpoint directory holds."""
    return validate(read_recipe_data(path / RECIPE), str(path / RECIPE), name=path.name)


def save_checkpoint(model: GPT, recipe: Recipe, out_dir: str | Path) -> Path:
    """Write model weights and recipe to a new directory ``out_dir`` (which must not hold files)."""
    with new_directory(out_dir) as tmp:
        write_files(
            tmp, {k: v for k, v in model.state_dict().items() if not (model.tied and k == "lm_head.weight")}, recipe
        )
    return Path(out_dir)


def load_checkpoint(
    path: str | Path, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> GPT:
    """Build the checkpoint's recipe and load its weights; every tensor must be present and fit."""
    path = Path(path)
    for name in (WEIGHTS, RECIPE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path} is not a gptzoo checkpoint: {name} is missing")
    recipe = read_recipe(path)
    model = build_model(recipe, device="meta")
    try:
        tensors = load_file(str(path / WEIGHTS), device=str(device or "cpu"))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read {path / WEIGHTS}: {exc}") from None
    expected = {k for k in model.state_dict() if not (model.tied and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - tensors.keys()), sorted(tensors.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(f"{path / WEIGHTS} does not match its recipe: missing {missing}, unexpected {unexpected}")
    for key, param in model.state_dict().items():
        if key in tensors and tensors[key].shape != param.shape:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} has shape {tuple(tensors[key].shape)}, the recipe needs {tuple(param.shape)}"
            )
    model.load_weights(tensors, source=str(path))
    if dtype is not None:
        model.to(dtype)
    return model

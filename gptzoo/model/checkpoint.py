"""gptzoo checkpoints: a directory with model.safetensors and the resolved recipe.toml.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into place
only when complete, so an interrupted save leaves nothing half-written. A tied LM head is not
stored (as in Hugging Face files); loading re-ties it. Loading may apply ``--set`` overrides to the
stored recipe as long as the model keeps exactly the stored tensors (names and shapes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError, Interrupted
from gptzoo.model.build import build_model
from gptzoo.model.gpt import GPT
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.recipe import Recipe, override_recipe, read_recipe_data, validate
from gptzoo.registry import Registry, default_registry

WEIGHTS = "model.safetensors"
RECIPE = "recipe.toml"


def _strings(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """Every string in recipe data, with its key path (``model.norm.name``, ``generate.stop[0]``)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, key)
            yield from _strings(v, f"{key}.{k}" if key else k)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


def check_writable(recipe: Recipe) -> None:
    """A recipe whose text can be written as UTF-8 TOML and read back (no lone surrogates, which
    undecodable bytes on a command line become)."""
    for key, text in _strings(recipe.to_dict(), ""):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise CheckpointError(
                f"recipe {recipe.name!r}: {key} = {text!r} holds a character that is not valid Unicode "
                "(an undecodable byte?), so its recipe.toml could not be read back; give that value as text"
            ) from None


def write_files(directory: Path, tensors: dict[str, torch.Tensor], recipe: Recipe) -> None:
    """The checkpoint files (weights and recipe) into ``directory``, which is being written atomically."""
    check_writable(recipe)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt", "gptzoo_version": gptzoo_version()})
    (directory / RECIPE).write_text(recipe.to_toml(), encoding="utf-8")


def read_recipe(path: Path, *, registry: Registry | None = None) -> Recipe:
    """The resolved recipe a checkpoint directory holds (a RecipeError names its recipe.toml)."""
    return validate(read_recipe_data(path / RECIPE), str(path / RECIPE), name=path.name, registry=registry)


def stored_shapes(model: GPT) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of this model holds, by name: its state dict without a tied head."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if not (model.tied and k == "lm_head.weight")}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _n_blocks(keys: Iterable[str]) -> int:
    return len({m.group(1) for k in keys if (m := re.match(r"blocks\.(\d+)\.", k))})


def first_difference(stored: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]]) -> str | None:
    """How a model's tensors (``wanted``) first differ from a checkpoint's (``stored``), or None."""
    have, need = _n_blocks(stored), _n_blocks(wanted)
    if have != need:
        return f"it has {have} blocks' weights, the overridden recipe needs {need}"
    for key, shape in stored.items():
        if key not in wanted:
            return f"it has a tensor {key} that the overridden recipe does not use"
        if wanted[key] != shape:
            return f"its {key} has shape {shape}, the overridden recipe needs {wanted[key]}"
    for key in wanted:
        if key not in stored:
            return f"the overridden recipe needs a tensor {key} that it does not have"
    return None


def save_checkpoint(model: GPT, recipe: Recipe, out_dir: str | Path) -> Path:
    """Write model weights and recipe to a new directory ``out_dir`` (which must not hold files).

    Raises:
        CheckpointError: ``out_dir`` holds files or cannot be written, or the recipe cannot be written.
        Interrupted: Ctrl-C during the write (nothing is left behind).
    """
    check_writable(recipe)
    keys = stored_shapes(model)
    try:
        with new_directory(out_dir) as tmp:
            write_files(tmp, {k: v for k, v in model.state_dict().items() if k in keys}, recipe)
    except KeyboardInterrupt:
        raise Interrupted(f"nothing was written to {out_dir}") from None
    return Path(out_dir)


def load_checkpoint(
    path: str | Path,
    *,
    overrides: Sequence[str] = (),
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
) -> GPT:
    """Build the checkpoint's recipe and load its weights; every tensor must be present and fit.

    ``overrides`` (``--set`` style) change the stored recipe only where the model keeps the stored
    tensors, e.g. ``generate.max_new_tokens=20``, ``model.attention=eager`` or ``model.norm.eps=1e-6``;
    ``model.n_layer=3`` on a 2-layer checkpoint is refused. The model's ``recipe`` is the overridden one.

    Example::

        model = load_checkpoint("runs/gpt2-tiny/step-1000", overrides=["model.attention=eager"])
    """
    registry = registry if registry is not None else default_registry()
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no such checkpoint directory: {path}")
    for name in (WEIGHTS, RECIPE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path} is not a gptzoo checkpoint: {name} is missing")
    saved = read_recipe(path, registry=registry)
    model = build_model(saved, device="meta", registry=registry)
    expected = stored_shapes(model)
    if overrides:
        recipe = override_recipe(saved, overrides, registry=registry)
        model = build_model(recipe, device="meta", registry=registry)
        difference = first_difference(expected, stored_shapes(model))
        if difference is not None:
            raise CheckpointError(
                f"--set {', '.join(overrides)} does not fit the checkpoint {path}: {difference} "
                "(a checkpoint's shapes cannot change)"
            )
    try:
        tensors = load_file(str(path / WEIGHTS), device=str(device or "cpu"))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read {path / WEIGHTS}: {exc}") from None
    missing, unexpected = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"{path / WEIGHTS} does not match its recipe: missing {missing}, unexpected {unexpected}")
    first = next(iter(expected))
    for key, shape in expected.items():
        tensor = tensors[key]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{path / WEIGHTS}: {key} has shape {tuple(tensor.shape)}, the recipe needs {shape}")
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} holds {_name(tensor.dtype)} values; "
                "a checkpoint's weights are floating point (float32, bfloat16 or float16)"
            )
        if tensor.dtype != tensors[first].dtype:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} is {_name(tensor.dtype)} but {first} is {_name(tensors[first].dtype)}; "
                "a checkpoint's weights share one dtype"
            )
    model.load_weights(tensors, source=str(path))
    if dtype is not None:
        model.to(dtype)
    return model

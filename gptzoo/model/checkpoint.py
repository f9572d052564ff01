"""gptzoo checkpoints: a directory with model.safetensors and the resolved recipe.toml (and, for
weights from Hugging Face, that checkpoint's tokenizer files). The recipe.toml ends with a
``[provenance]`` table: the distribution and version of each component (gptzoo.recipe.schema), so
that loading a checkpoint whose plugin is missing names what to install.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into place
only when complete, so an interrupted save leaves nothing half-written. A tied LM head is not
stored (as in Hugging Face files); loading re-ties it. Every file is read as gptzoo.untrusted
requires (inside the directory, regular files). Loading may apply ``--set`` overrides to the stored
recipe where the weights keep their meaning: any section but [model]; in [model], the attention
kernel, a component's parameters, context_length and init_std, as long as the model keeps exactly
the stored tensors (names and shapes).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gptzoo.atomic import new_directory
from gptzoo.defaults import WEIGHT_DTYPES
from gptzoo.errors import CheckpointError, Interrupted
from gptzoo.model.build import build_model
from gptzoo.model.gpt import GPT
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.recipe import COMPONENT_KEYS, ModelSpec, Recipe, entry_of, override_recipe, validate
from gptzoo.recipe.load import read_resolved_recipe_data
from gptzoo.recipe.schema import LAYER_TYPES
from gptzoo.registry import Registry, default_registry
from gptzoo.tokenizer import HF_TOKENIZER_SAVED
from gptzoo.untrusted import (
    TOKENIZER_CONFIG,
    WEIGHT_DTYPES_TEXT,
    check_tokenizer_config,
    check_utf8_path,
    checkpoint_file,
    dtype_name,
    first_few,
    supplies,
)

WEIGHTS = "model.safetensors"
RECIPE = "recipe.toml"
FILES = (WEIGHTS, RECIPE)
"""What every checkpoint directory holds."""
FREE_MODEL_KEYS = ("attention", "context_length", "init_std")
"""[model] keys ``--set`` may change on a checkpoint (while the tensors fit): the attention kernel
computes the same function, a context length changes no weight, init_std only initializes. The
other components may change their parameters (a norm's eps, RoPE's theta), not their names."""


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


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors on the CPU, contiguous, each with memory of its own, as safetensors writes them: a
    tensor whose memory another name already holds (a component that keeps one parameter under two
    names) is copied, so the file holds every name (loading then gives each its own tensor)."""
    held: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in held:
            tensor = tensor.clone()
        elif tensor.numel():  # an empty tensor holds no memory to share
            held.add(storage)
        out[key] = tensor
    return out


def write_files(directory: Path, tensors: dict[str, torch.Tensor], recipe: Recipe) -> None:
    """The checkpoint files (weights and recipe) into ``directory``, which is being written atomically."""
    check_writable(recipe)
    tensors = unshared(tensors)
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt", "gptzoo_version": gptzoo_version()})
    (directory / RECIPE).write_text(recipe.to_toml(), encoding="utf-8")


def read_recipe(path: Path, *, registry: Registry | None = None) -> Recipe:
    """The resolved recipe a checkpoint directory holds (a RecipeError names its recipe.toml, missing
    too; a CheckpointError one that is not a regular file inside the directory)."""
    real = checkpoint_file(path, RECIPE, missing=f"{path / RECIPE} is missing") if supplies(path, RECIPE) else None
    data = read_resolved_recipe_data(path / RECIPE, real=real)
    return validate(data, str(path / RECIPE), name=path.name, registry=registry)


def stored_shapes(model: GPT) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of this model holds, by name: its state dict without a tied head."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if not (model.tied and k == "lm_head.weight")}


def _n_blocks(keys: Iterable[str]) -> int:
    return len({m.group(1) for k in keys if (m := re.match(r"blocks\.(\d+)\.", k))})


def structural_change(saved: ModelSpec, wanted: ModelSpec, registry: Registry) -> str | None:
    """How an overridden [model] first changes what a checkpoint's weights mean, or None: a
    component other than attention that resolves to another entry (``dyt`` written
    ``gptzoo-a:dyt`` is the same one), in [model] or in any layer (the schedule may be written
    otherwise), or any other key changed but FREE_MODEL_KEYS."""
    for f in fields(ModelSpec):
        if f.name in FREE_MODEL_KEYS or f.name in ("layer_pattern", LAYER_TYPES):
            continue
        before, after = getattr(saved, f.name), getattr(wanted, f.name)
        if f.name in COMPONENT_KEYS:
            if entry_of(f.name, before, registry) is entry_of(f.name, after, registry):
                continue
            before, after = before.name, after.name
        if before != after:
            return f"model.{f.name} would change from {before!r} to {after!r}"
    for i, (mine, theirs) in enumerate(zip(saved.schedule(), wanted.schedule(), strict=False)):
        for kind in COMPONENT_KEYS:  # each layer's components, whatever the schedule's names
            before, after = saved.layer_components(mine)[kind], wanted.layer_components(theirs)[kind]
            if kind not in FREE_MODEL_KEYS and entry_of(kind, before, registry) is not entry_of(kind, after, registry):
                return f"layer {i}'s {kind} would change from {before.name!r} to {after.name!r}"
    return None


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


def tokenizer_files(directory: Path) -> list[str]:
    """The Hugging Face tokenizer files (HF_TOKENIZER_SAVED) that ``directory`` has."""
    return [name for name in HF_TOKENIZER_SAVED if supplies(directory, name)]


def tokenizer_copies(source: str | Path | None) -> dict[str, Path]:
    """The Hugging Face tokenizer files of the directory ``source`` (none for None), each by name
    with the real path to copy it from, checked as gptzoo.untrusted requires (the file names in
    its tokenizer_config.json too, which the copy keeps)."""
    if source is None:
        return {}
    source = Path(source)
    names = tokenizer_files(source)
    copies = {name: checkpoint_file(source, name, missing=f"{source / name} is missing") for name in names}
    if TOKENIZER_CONFIG in copies:
        check_tokenizer_config(source)
    return copies


def copy_files(copies: dict[str, Path], directory: Path) -> None:
    """The files of :func:`tokenizer_copies` into ``directory`` (being written atomically)."""
    for name, real in copies.items():
        shutil.copyfile(real, directory / name)


def save_checkpoint(
    model: GPT, recipe: Recipe, out_dir: str | Path, *, tokenizer_from: str | Path | None = None
) -> Path:
    """Write model weights and recipe to a new directory ``out_dir`` (which must not hold files),
    with the Hugging Face tokenizer files of the directory ``tokenizer_from`` if given (the
    checkpoint the weights came from), which a recipe's tokenizer "hf" then reads.

    Raises:
        CheckpointError: ``out_dir`` holds files, cannot be written or is not UTF-8, the recipe
            cannot be written, or a tokenizer file is not one the directory may supply.
        Interrupted: Ctrl-C during the write (nothing is left behind).
    """
    check_writable(recipe)
    check_utf8_path(out_dir)
    keys = stored_shapes(model)
    copies = tokenizer_copies(tokenizer_from)
    try:
        with new_directory(out_dir) as tmp:
            write_files(tmp, {k: v for k, v in model.state_dict().items() if k in keys}, recipe)
            copy_files(copies, tmp)
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

    ``overrides`` (``--set`` style) change the stored recipe only where the weights keep their
    meaning: any section but [model] (``generate.max_new_tokens=20``, ``tokenizer.name=bytes``); in
    [model], the attention kernel (``model.attention=eager``), a component's parameters
    (``model.norm.eps=1e-6``), context_length and init_std, while the model keeps exactly the stored
    tensors. ``model.n_layer=3`` on a 2-layer checkpoint is refused (its shapes would change), and so
    is ``model.activation=relu`` on a GELU one (its structure would). The model's ``recipe`` is the
    overridden one.

    Example::

        model = load_checkpoint("runs/gpt2-tiny/step-1000", overrides=["model.attention=eager"])
    """
    registry = registry if registry is not None else default_registry()
    if not str(path):  # Path("") would be "."
        raise CheckpointError("an empty checkpoint directory name; give the directory (e.g. from `gptzoo build --out`)")
    path = Path(path)
    if not path.is_dir():
        if path.exists():
            raise CheckpointError(f"{path} is a file, not a checkpoint directory; give the directory that holds it")
        raise CheckpointError(f"no such checkpoint directory: {path}")
    check_utf8_path(path)
    weights, _ = (checkpoint_file(path, n, missing=f"{path} is not a gptzoo checkpoint: {n} is missing") for n in FILES)
    saved = read_recipe(path, registry=registry)
    model = build_model(saved, device="meta", registry=registry)
    expected = stored_shapes(model)
    if overrides:
        recipe = override_recipe(saved, overrides, registry=registry)
        model = build_model(recipe, device="meta", registry=registry)
        refused = f"--set {', '.join(overrides)} does not fit the checkpoint {path}"
        difference = first_difference(expected, stored_shapes(model))
        if difference is not None:
            raise CheckpointError(f"{refused}: {difference} (a checkpoint's shapes cannot change)")
        change = structural_change(saved.model, recipe.model, registry)
        if change is not None:
            raise CheckpointError(
                f"{refused}: a checkpoint's structure cannot change: {change} (on a checkpoint, [model] takes only "
                "the attention kernel, a component's parameters, context_length and init_std)"
            )
    try:
        tensors = load_file(str(weights), device=str(device or "cpu"))
    except (SafetensorError, OSError, RuntimeError) as exc:  # RuntimeError: torch mapping a file that is gone
        if not weights.is_file():  # checked above: the checkpoint went away meanwhile
            raise CheckpointError(
                f"checkpoint {path} changed or disappeared while it was read ({WEIGHTS} is gone; a training "
                "run that keeps only its newest checkpoints removes older ones); read one that is kept, or copy it "
                "elsewhere first"
            ) from None
        raise CheckpointError(f"cannot read {path / WEIGHTS}: {exc}") from None
    missing, unexpected = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        have, need = _n_blocks(tensors), _n_blocks(expected)
        difference = (
            f"it has {have} blocks' weights, the recipe needs {need}"
            if have != need
            else f"missing {_few(missing)}, unexpected {_few(unexpected)}"
        )
        raise CheckpointError(f"{path / WEIGHTS} does not match its recipe: {difference}")
    first = next(iter(expected))
    for key, shape in expected.items():
        tensor = tensors[key]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{path / WEIGHTS}: {key} has shape {tuple(tensor.shape)}, the recipe needs {shape}")
        if dtype_name(tensor.dtype) not in WEIGHT_DTYPES:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} holds {dtype_name(tensor.dtype)} values; a checkpoint's weights are "
                f"{WEIGHT_DTYPES_TEXT}"
            )
        if tensor.dtype != tensors[first].dtype:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} is {dtype_name(tensor.dtype)} but {first} is "
                f"{dtype_name(tensors[first].dtype)}; a checkpoint's weights share one dtype"
            )
    broken = [key for key, tensor in tensors.items() if not bool(torch.isfinite(tensor).all())]
    if broken:  # the rule of every dtype: int8 and int4 refuse them too, and a Hugging Face checkpoint's
        raise CheckpointError(
            f"{path / WEIGHTS}: {_few(broken)} {'holds' if len(broken) == 1 else 'hold'} NaN or infinite values (e.g. "
            "from a diverged training run), which make every output NaN; load an earlier checkpoint of the run"
        )
    model.load_weights(tensors, source=str(path))
    if dtype is not None:
        model.to(dtype)
    return model


def _few(keys: list[str]) -> str:
    """Tensor names for a message: none, or the first few and how many more."""
    return first_few([repr(k) for k in keys], sep=", ") if keys else "none"

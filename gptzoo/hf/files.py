"""Hugging Face checkpoint files: finding a checkpoint, reading config.json and tensors, writing.

A source is a local directory, a name gptzoo can fetch (gptzoo.fetch, e.g. ``smollm2-135m``), or a
hub name (``gpt2``) resolved through the local Hugging Face cache, downloading only when a network
is there. Tensors come from model.safetensors (or its sharded index) or, failing that, from
pytorch_model.bin loaded with ``weights_only=True``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
HUB_FILES = ["config.json", "*.safetensors", "*.json", "*.txt", "*.model", "tokenizer*"]


def locate(source: str | Path) -> Path:
    """The local directory of a checkpoint, by path, fetchable name or hub name."""
    from gptzoo.fetch import resolve_fetchable

    text = str(source)
    if not text:
        raise CheckpointError("an empty checkpoint name; give a directory, a fetchable name or a hub name")
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{text} is not a checkpoint directory")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:  # a path, not a hub name like org/name
        raise CheckpointError(f"no such checkpoint directory: {text}")
    fetched = resolve_fetchable(text, fetch_missing=True)
    if fetched is not None:
        return fetched
    return _from_hub(text)


def _from_hub(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, local_files_only=True, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a malformed repo id and the like
        raise CheckpointError(f"{name!r} is neither a checkpoint directory nor a hub name: {exc}") from None
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as exc:
        raise CheckpointError(
            f"{name!r} is not a local directory, not a name gptzoo fetches, and not in the Hugging Face cache; "
            f"downloading it failed ({type(exc).__name__}: no network?); pass a checkpoint directory"
        ) from None


def read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG
    if not file.is_file():
        raise CheckpointError(f"{path} is not a Hugging Face checkpoint: {CONFIG} is missing")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{file} is not a JSON object")
    return config


def read_tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, on the CPU, in its stored dtype."""
    try:
        if (path / SAFETENSORS).is_file():
            return load_file(str(path / SAFETENSORS))
        if (path / SAFETENSORS_INDEX).is_file():
            index = json.loads((path / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
            tensors: dict[str, Tensor] = {}
            for shard in sorted(set(index["weight_map"].values())):
                tensors.update(load_file(str(path / shard)))
            return tensors
        if (path / PYTORCH_BIN).is_file():
            return _state_dict(_torch_load(path / PYTORCH_BIN), path / PYTORCH_BIN)
    except (
        SafetensorError,
        OSError,
        RuntimeError,
        KeyError,
        TypeError,
        AttributeError,
        json.JSONDecodeError,
        pickle.UnpicklingError,
    ) as exc:
        raise CheckpointError(f"cannot read the weights in {path}: {type(exc).__name__}: {exc}") from None
    raise CheckpointError(f"{path} has no weights: none of {SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH_BIN}")


def _torch_load(file: Path) -> Any:
    """A pickled checkpoint, tensors only (weights_only=True); memory-mapped unless it predates
    torch's zip format, as the original GPT-2 files do."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        return torch.load(file, map_location="cpu", weights_only=True)


def _state_dict(obj: Any, file: Path) -> dict[str, Tensor]:
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{file} does not hold a state dict (a mapping of names to tensors)")
    return obj


def write_checkpoint(out: Path, config: Any, tensors: dict[str, Tensor]) -> Path:
    """Write config (a transformers PretrainedConfig) and tensors to a new directory, atomically."""
    with new_directory(out) as tmp:
        config.save_pretrained(tmp)
        save_file(tensors, str(tmp / SAFETENSORS), metadata={"format": "pt"})
    return out

"""Hugging Face checkpoint files: finding a checkpoint, reading config.json and tensors, writing.

A source is a local directory, a name gptzoo can fetch (gptzoo.fetch, e.g. ``smollm2-135m``), or a
hub name (``gpt2``) resolved through the local Hugging Face cache, downloading only when a network
is there. Tensors come from model.safetensors (or its sharded index) or, failing that, from
pytorch_model.bin loaded with ``weights_only=True``.
"""

from __future__ import annotations

import json
import pickle
import warnings
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
    return _read_json(file, CONFIG)


def _read_json(file: Path, what: str) -> dict[str, Any]:
    """A JSON object from a checkpoint file (NaN and Infinity are not JSON and are refused)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError, OSError) as exc:  # ValueError: JSON and UTF-8 decoding errors
        raise CheckpointError(f"{file} is not valid JSON: {_one_line(exc)}; fix or replace the {what}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} is not a JSON object; fix or replace the {what}")
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def read_tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, on the CPU, in its stored dtype.

    The shards of a sharded checkpoint are the files its index names: each must be a file inside the
    checkpoint directory once symlinks are resolved (in a Hugging Face cache snapshot, also inside
    the repository's blobs/ folder, where the cache keeps what the snapshot links to), and hold
    exactly the tensors the index says it holds."""
    if (path / SAFETENSORS).is_file():
        return _load_safetensors(path / SAFETENSORS)
    if (path / SAFETENSORS_INDEX).is_file():
        return _read_sharded(path, path / SAFETENSORS_INDEX)
    if (path / PYTORCH_BIN).is_file():
        return _state_dict(_torch_load(path / PYTORCH_BIN), path / PYTORCH_BIN)
    raise CheckpointError(f"{path} has no weights: none of {SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH_BIN}")


def _load_safetensors(file: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, RuntimeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read the weights in {file}: {type(exc).__name__}: {_one_line(exc)}") from None


def _read_sharded(path: Path, index: Path) -> dict[str, Tensor]:
    weight_map = _read_json(index, "index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: weight_map is not a non-empty object of tensor name -> shard file name")
    bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
    if bad is not None:
        raise CheckpointError(f"{index}: weight_map[{bad[0]!r}] = {bad[1]!r} is not a shard file name")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    roots = _roots(path)
    tensors: dict[str, Tensor] = {}
    for shard, names in shards.items():
        entry = f"{index}: weight_map[{names[0]!r}] = {shard!r}"
        try:
            file = (path / shard).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise CheckpointError(f"{entry} cannot be resolved ({_one_line(exc)})") from None
        if not any(file.is_relative_to(root) for root in roots):
            raise CheckpointError(
                f"{entry} names a file outside {path}; every shard must be a file inside the checkpoint directory "
                "(after following symlinks)"
            )
        if not file.is_file():
            raise CheckpointError(f"{entry} names a shard that is missing (or not a file)")
        held = _load_safetensors(file)  # the file checked, not the name again (which could be relinked)
        stray = sorted(set(held) - set(names))
        if stray:
            owner = weight_map.get(stray[0])
            where = f"the index maps it to {owner!r}" if owner is not None else "the index does not list it"
            raise CheckpointError(f"{index}: shard {shard!r} holds tensor {stray[0]!r}, but {where}")
        absent = sorted(set(names) - set(held))
        if absent:
            raise CheckpointError(f"{index}: weight_map[{absent[0]!r}] = {shard!r}, but that shard does not hold it")
        tensors.update(held)
    return tensors


def _roots(path: Path) -> list[Path]:
    """Where a shard may live: the checkpoint directory, and for a Hugging Face cache snapshot
    (models--org--name/snapshots/REV) that repository's blobs/ folder."""
    real = path.resolve()
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(real.parent.parent / "blobs")
    return roots


def _torch_load(file: Path) -> Any:
    """A pickled checkpoint, tensors only (weights_only=True: torch refuses a pickle that asks for
    anything else, and nothing in it runs); memory-mapped unless it predates torch's zip format, as
    the original GPT-2 files do."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4 ...": the error below says it all
            try:
                return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{file} was refused: torch.load(weights_only=True) reads only tensors and plain containers, and "
            f"this pickle holds something else ({_refusal(exc)}); nothing in it ran; use a model.safetensors "
            "from a source you trust"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise CheckpointError(f"cannot read the weights in {file}: {type(exc).__name__}: {_one_line(exc)}") from None


def _refusal(exc: BaseException) -> str:
    """The line of torch's weights_only error that says what was refused (it also advises
    weights_only=False, which would run the pickle: not repeated here)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Check the documentation", "Weights only load failed"))]
    useful = [line for line in useful if "weights_only" not in line and "Please file an issue" not in line]
    return useful[-1].rstrip(".") if useful else "an unsupported pickle"


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

"""Hugging Face checkpoint files: finding a checkpoint, reading config.json and tensors, writing.

A source is a local directory, a name gptzoo can fetch (gptzoo.fetch, e.g. ``smollm2-135m``), or a
hub name (``gpt2``) resolved through the local Hugging Face cache, downloading only when a network
is there. Tensors come from model.safetensors (or its sharded index) or, failing that, from
pytorch_model.bin loaded with ``weights_only=True``. Every file is read as gptzoo.untrusted
requires: a regular file inside the checkpoint directory once symlinks are followed.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError
from gptzoo.hf.family import show as family_show
from gptzoo.model.checkpoint import copy_files, unshared
from gptzoo.untrusted import NAME_LIMIT, check_utf8_path, checkpoint_file, pickle_refusal, read_json, supplies


@dataclass(frozen=True)
class Checkpoint:
    """A Hugging Face checkpoint found and its config.json read, once: what hf_recipe, load_hf and compare
    are handed, so that loading ``--hf DIR`` reads config.json one time."""

    source: str
    """As the user named it: a directory, a fetchable name or a hub name."""
    path: Path
    """Its local directory."""
    config: dict[str, Any]

    def __str__(self) -> str:
        return self.source


def open_checkpoint(source: str | Path | Checkpoint) -> Checkpoint:
    """The checkpoint ``source`` names, its config.json read (one already open is returned as it is)."""
    if isinstance(source, Checkpoint):
        return source
    path = locate(source)
    return Checkpoint(str(source), path, read_config(path))


CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
HUB_FILES = ["config.json", "*.safetensors", "*.json", "*.txt", "*.model", "tokenizer*"]


def locate(source: str | Path | Checkpoint) -> Path:
    """The local directory of a checkpoint, by path, fetchable name or hub name."""
    if isinstance(source, Checkpoint):
        return source.path
    text = str(source)
    if not text:
        raise CheckpointError("an empty checkpoint name; give a directory, a fetchable name or a hub name")
    path = _find(text)
    check_utf8_path(path)
    return path


def _find(text: str) -> Path:
    from gptzoo.fetch import resolve_fetchable

    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of no such user
        user = text[1:].partition("/")[0]
        raise CheckpointError(f"no such checkpoint directory: {text} (~{user} names no user on this machine)") from None
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

    from gptzoo.fetch import offline

    try:
        return Path(snapshot_download(name, local_files_only=True, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a malformed repo id and the like
        raise CheckpointError(f"{name!r} is neither a checkpoint directory nor a hub name: {exc}") from None
    forbidden = offline()
    if forbidden is not None:
        raise CheckpointError(
            f"{name!r} is not a local directory, not a name gptzoo fetches, and not in the Hugging Face cache, and "
            f"{forbidden} forbids downloading it; pass a checkpoint directory, or unset "
            f"{forbidden.partition('=')[0]} (and drop --offline) to download it from the hub"
        )
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as exc:
        raise CheckpointError(
            f"{name!r} is not a local directory, not a name gptzoo fetches, and not in the Hugging Face cache; "
            f"downloading it failed ({type(exc).__name__}: no network?); pass a checkpoint directory"
        ) from None


def read_config(path: Path) -> dict[str, Any]:
    missing = f"{path} is not a Hugging Face checkpoint: {CONFIG} is missing"
    return read_json(checkpoint_file(path, CONFIG, missing=missing), path / CONFIG, CONFIG)


def show(value: Any) -> str:
    """A name or value from a checkpoint file, for a message."""
    return family_show(value, NAME_LIMIT)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def read_tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, on the CPU, in its stored dtype.

    The weights are the first of model.safetensors, its sharded index, pytorch_model.bin that the
    directory has; each file read (the shards too, by the names the index gives) must be a regular
    file inside the checkpoint directory once symlinks are resolved (gptzoo.untrusted), and each
    shard must hold exactly the tensors the index says it holds."""
    name = next((n for n in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN) if supplies(path, n)), None)
    if name is None:
        raise CheckpointError(f"{path} has no weights: none of {SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH_BIN}")
    real = checkpoint_file(path, name, missing=f"{path / name} is missing")
    if name == SAFETENSORS:
        return _load_safetensors(real, path / name)
    if name == SAFETENSORS_INDEX:
        return _read_sharded(path, real)
    return _state_dict(_torch_load(real, path / name), path / name)


def _load_safetensors(real: Path, file: Path | str) -> dict[str, Tensor]:
    try:
        return load_file(str(real))
    except (SafetensorError, OSError, RuntimeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read the weights in {file}: {type(exc).__name__}: {_one_line(exc)}") from None


def _read_sharded(path: Path, real: Path) -> dict[str, Tensor]:
    index = path / SAFETENSORS_INDEX
    data = read_json(real, index, "index")
    if not isinstance(data.get("metadata", {}), dict):  # unused here, but transformers reads it
        raise CheckpointError(f"{index}: metadata={show(data['metadata'])} is not an object; fix or remove it")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: weight_map is not a non-empty object of tensor name -> shard file name")
    bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
    if bad is not None:
        raise CheckpointError(f"{index}: weight_map[{show(bad[0])}] = {show(bad[1])} is not a shard file name")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    tensors: dict[str, Tensor] = {}
    for shard, names in shards.items():
        entry = f"{index}: weight_map[{show(names[0])}] = {show(shard)}"
        file = checkpoint_file(path, shard, missing=f"{entry} names a shard that is missing", entry=entry)
        held = _load_safetensors(file, path / shard)
        stray = sorted(set(held) - set(names))
        if stray:
            owner = weight_map.get(stray[0])
            where = f"the index maps it to {show(owner)}" if owner is not None else "the index does not list it"
            raise CheckpointError(f"{index}: shard {show(shard)} holds tensor {show(stray[0])}, but {where}")
        absent = sorted(set(names) - set(held))
        if absent:
            raise CheckpointError(
                f"{index}: weight_map[{show(absent[0])}] = {show(shard)}, but that shard does not hold it"
            )
        tensors.update(held)
    return tensors


def _torch_load(real: Path, file: Path) -> Any:
    """A pickled checkpoint, tensors only (weights_only=True: torch refuses a pickle that asks for
    anything else, and nothing in it runs); memory-mapped unless it predates torch's zip format, as
    the original GPT-2 files do."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4 ...": the error below says it all
            try:
                return torch.load(real, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                return torch.load(real, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{file} was refused: torch.load(weights_only=True) reads only tensors and plain containers, and "
            f"this pickle holds something else ({pickle_refusal(exc)}); nothing in it ran; use a model.safetensors "
            "from a source you trust"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise CheckpointError(f"cannot read the weights in {file}: {type(exc).__name__}: {_one_line(exc)}") from None


def _state_dict(obj: Any, file: Path) -> dict[str, Tensor]:
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{file} does not hold a state dict (a mapping of names to tensors)")
    for key, tensor in obj.items():  # a pickle can hold what a safetensors file cannot
        if tensor.layout != torch.strided:
            layout = str(tensor.layout).removeprefix("torch.")
            raise CheckpointError(f"{file}: {show(key)} is a {layout} tensor; a checkpoint's weights are dense tensors")
        if tensor.device.type != "cpu":
            raise CheckpointError(
                f"{file}: {show(key)} is a {tensor.device.type} tensor, which holds no values; "
                "a checkpoint's weights hold their values"
            )
    return obj


def write_checkpoint(out: Path, config: Any, tensors: dict[str, Tensor], copies: dict[str, Path]) -> Path:
    """Write config (a transformers PretrainedConfig), tensors and the files ``copies`` (name -> the
    real path to copy, see gptzoo.model.checkpoint.tokenizer_copies) to a new directory, atomically."""
    check_utf8_path(out)
    with new_directory(out) as tmp:
        config.save_pretrained(tmp)
        save_file(unshared(tensors), str(tmp / SAFETENSORS), metadata={"format": "pt"})
        copy_files(copies, tmp)
    return out

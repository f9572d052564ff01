"""Adapters in peft's on-disk format: ``adapter_config.json`` and ``adapter_model.safetensors``, whose
tensors are named after the Hugging Face model's modules (``base_model.model.model.layers.0.self_attn.
q_proj.lora_A.weight``), as peft's ``save_pretrained`` writes them and ``PeftModel.from_pretrained`` and
vLLM read them.

Names and rows go through the model's Hugging Face tensor maps (gptzoo.hf.tensor_map), the ones
``gptzoo export`` writes the weights with, so an adapter lands where its weights do: a projection that
the family stores as several modules (gptzoo's fused ``c_attn`` as q_proj, k_proj and v_proj) gives each
of them the rows of B that are its rows, with A shared; one whose rows a family interleaves or permutes
(GPT-NeoX's query_key_value) gets B's rows in the same order; a family that stores a projection as
Conv1D keeps peft's [r, in] / [out, r] adapter shapes. Where several parts of one projection land in one
of their modules (q and v in GPT-2's c_attn), their adapters are stacked into one of rank r x parts,
with the same scale (``rank_pattern`` and ``alpha_pattern``).

Reading is the other way round, and merges: each adapted module's ``scale B A`` (DoRA: its rows rescaled
to the stored magnitudes) is added to the rows of gptzoo's weight that the module's tensor maps to, so the
model then runs at its plain speed, natively decoded, and any module peft targets that has a plain weight
map can be adapted, chosen by gptzoo or not.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gptzoo.adapters.lora import LoRALinear, LoRASpec, adapted
from gptzoo.atomic import new_directory
from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.registry import Registry, default_registry
from gptzoo.untrusted import checkpoint_file

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
SUPPORTED_TYPE = "LORA"
Rows = list[tuple[str, tuple[str, ...], TensorMap]]


def hf_rows(model: GPT, registry: Registry | None) -> Rows:
    """The model's Hugging Face tensor map, of the family ``gptzoo export`` writes it as."""
    from gptzoo.hf.convert import equivalent

    if model.recipe is None:
        raise GptzooError("the model has no recipe; load it with gptzoo.load_model")
    _, _, rows = equivalent(model.recipe, registry if registry is not None else default_registry())
    return rows


def row_indices(tmap: TensorMap, out_features: int) -> list[Tensor]:
    """For each of the map's tensors, which of our weight's rows it holds, in its order."""
    if tmap.transpose:
        return [torch.arange(out_features)]
    index = torch.arange(out_features, dtype=torch.float64).unsqueeze(1)
    return [t[:, 0].long() for t in tmap.save(index)]


def _module(key: str) -> str:
    return key.removesuffix(".weight")


def _weight_row(rows: Rows, linear: str) -> tuple[tuple[str, ...], TensorMap]:
    for ours, theirs, tmap in rows:
        if ours == linear + ".weight":
            if tmap.stack or (tmap.transpose and tmap.groups > 1):
                raise GptzooError(
                    f"{linear} is stored as a slice of a stacked or column-interleaved Hugging Face tensor "
                    f"({', '.join(theirs)}), which peft's LoRA format cannot adapt; choose other --targets"
                )
            return theirs, tmap
    raise GptzooError(f"{linear} has no Hugging Face weight of its own; choose other --targets")


def _short_names(modules: list[str], every: list[str]) -> dict[str, str]:
    """target_modules' entries: the module's name without its layer (``self_attn.q_proj``), shortened to its
    last name (``q_proj``) where no module left out of the adapter shares that last name."""

    def suffix(name: str) -> str:
        return re.sub(r"^.*?\.\d+\.", "", name)

    chosen = {suffix(m) for m in modules}
    left_out = {suffix(m) for m in every} - chosen
    short = {}
    for name in modules:
        tail = suffix(name)
        last = tail.rpartition(".")[2]
        short[name] = last if not any(o.rpartition(".")[2] == last for o in left_out) else tail
    return short


def save_peft(model: GPT, out: Path, *, base: str, registry: Registry | None = None) -> dict[str, Any]:
    """Write the model's adapters (gptzoo.adapters.lora) to the new directory ``out`` in peft's format;
    the config written. ``base`` is its base_model_name_or_path."""
    tensors, config = peft_files(model, base=base, registry=registry)
    from safetensors.torch import save_file

    with new_directory(out) as tmp:
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt", "created_by": "gptzoo"})
    return config


def peft_files(model: GPT, *, base: str, registry: Registry | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The model's adapters as peft's format holds them: the tensors by key, and adapter_config.json.

    Raises:
        GptzooError: the model has no adapters, or peft's format cannot describe them (the model has no Hugging
            Face equivalent, or a projection's layout its adapters cannot follow).
    """
    wrapped = adapted(model)
    if not wrapped:
        raise GptzooError("the model has no adapters to save")
    spec = next(iter(wrapped.values())).spec
    rows = hf_rows(model, registry)
    every = [_module(t) for ours, theirs, _ in rows if ours.endswith(".weight") for t in theirs]
    tensors: dict[str, Tensor] = {}
    ranks: dict[str, int] = {}
    for linear, wrapper in wrapped.items():
        theirs, tmap = _weight_row(rows, linear)
        for key, index in zip(theirs, row_indices(tmap, wrapper.out_features), strict=True):
            found = _module_adapter(wrapper, index)
            if found is None:
                continue
            a, b, magnitude = found
            module = PREFIX + _module(key)
            tensors[module + ".lora_A.weight"] = a.contiguous()
            tensors[module + ".lora_B.weight"] = b.contiguous()
            if magnitude is not None:
                tensors[module + ".lora_magnitude_vector"] = magnitude.contiguous()
            ranks[_module(key)] = a.shape[0]
    short = _short_names(list(ranks), every)
    rank_pattern = {short[m]: r for m, r in ranks.items() if r != spec.rank}
    factor = {short[m]: r // spec.rank for m, r in ranks.items() if r != spec.rank}
    config = {
        "peft_type": SUPPORTED_TYPE,
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(set(short.values())),
        "use_dora": spec.dora,
        "use_rslora": spec.rslora,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "rank_pattern": rank_pattern,
        "alpha_pattern": {name: spec.alpha * (math.sqrt(k) if spec.rslora else k) for name, k in factor.items()},
    }  # peft's own keys only: peft warns of any other as written by a newer peft
    return tensors, config


@torch.no_grad()
def _module_adapter(wrapper: LoRALinear, index: Tensor) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """(A, B, magnitude) of the Hugging Face module holding our rows ``index``: the parts that reach it,
    stacked; None when none does."""
    a_parts, columns = [], []
    for name, start, stop in wrapper.parts:
        inside = (index >= start) & (index < stop)
        if bool(inside.any()):
            a_parts.append(wrapper.lora_A[name].detach().float())
            columns.append((name, start, inside))
    if not a_parts:
        return None
    r = wrapper.spec.rank
    b = torch.zeros(len(index), r * len(a_parts))
    magnitude = None
    if wrapper.spec.dora:  # rows outside every part keep their weight: a magnitude of their own norm
        magnitude = wrapper.weight.detach().float()[index].norm(dim=1)
    for i, (name, start, inside) in enumerate(columns):
        ours = index[inside] - start
        b[inside, i * r : (i + 1) * r] = wrapper.lora_B[name].detach().float()[ours]
        if magnitude is not None:
            magnitude[inside] = wrapper.lora_magnitude[name].detach().float()[ours]
    return torch.cat(a_parts), b, magnitude


@dataclass(frozen=True)
class PeftAdapter:
    """An adapter directory peft's format, read and checked."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, Tensor]

    def scale(self, module: str) -> float:
        """The scale of one module's adapter (rank_pattern and alpha_pattern applied, as peft applies them)."""
        r = _pattern(self.config.get("rank_pattern") or {}, module, self.config.get("r", 8))
        alpha = _pattern(self.config.get("alpha_pattern") or {}, module, self.config.get("lora_alpha", 8))
        return alpha / (math.sqrt(r) if self.config.get("use_rslora") else r)


def _pattern(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """peft's lookup of a module's entry in rank_pattern / alpha_pattern: a key that the module's name ends
    with, as a whole dotted name (a regular expression, as in peft)."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


UNSUPPORTED_FIELDS = {
    "modules_to_save": "whole modules saved beside the adapter",
    "layer_replication": "replicated layers",
    "trainable_token_indices": "trained token embeddings",
    "target_parameters": "adapted parameters (not modules)",
}


def split_adapter(text: str) -> tuple[str | None, str]:
    """``--adapter [NAME=]DIR`` as (NAME, DIR), NAME None where none is given: the text up to the first ``=`` is
    a name unless it holds a path separator (``runs/a=1/adapter`` is a directory)."""
    name, sep, directory = text.partition("=")
    if not sep or "/" in name or os.sep in name:
        return None, text
    return name, directory


def read_peft(path: str | Path) -> PeftAdapter:
    """An adapter directory written by peft (or by gptzoo), checked: a LoRA config gptzoo can apply.

    Raises:
        CheckpointError: no such directory or files, an unreadable config, a PEFT type other than LoRA,
            features gptzoo does not apply (biases, modules_to_save...), tensors of an unknown kind.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"--adapter {path}: no such directory; give a directory peft's save_pretrained wrote")
    config_file = checkpoint_file(
        path, CONFIG, missing=f"--adapter {path}: no {CONFIG} there; give a directory peft's save_pretrained wrote"
    )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"--adapter {path}: {CONFIG} cannot be read ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"--adapter {path}: {CONFIG} is not a JSON object")
    kind = config.get("peft_type")
    if kind != SUPPORTED_TYPE:
        raise CheckpointError(
            f"--adapter {path}: peft_type {kind!r} is not supported; gptzoo applies LoRA adapters (peft_type "
            f"'LORA', DoRA and rsLoRA included), not prefix tuning, IA3 or the other PEFT methods"
        )
    problems = [f"{field} ({what})" for field, what in UNSUPPORTED_FIELDS.items() if config.get(field)]
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        problems.append(f"bias {config.get('bias')!r} (trained biases)")
    for field in ("r", "lora_alpha"):
        value = config.get(field, 8)
        if type(value) not in (int, float) or not value > 0:
            problems.append(f"{field} {value!r} (a positive number is needed)")
    if problems:
        raise CheckpointError(f"--adapter {path}: {CONFIG} asks for {', '.join(problems)}, which gptzoo does not apply")
    weights = checkpoint_file(
        path, WEIGHTS, missing=f"--adapter {path}: no {WEIGHTS} there (gptzoo reads adapters saved as safetensors)"
    )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(weights))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"--adapter {path}: {WEIGHTS} cannot be read ({exc})") from None
    odd = [k for k in tensors if not re.search(r"\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$", k)]
    if odd:
        raise CheckpointError(
            f"--adapter {path}: {WEIGHTS} holds {', '.join(odd[:3])}, which are not LoRA tensors of a linear layer "
            "(gptzoo applies lora_A, lora_B and DoRA magnitudes of linear layers)"
        )
    return PeftAdapter(path, config, tensors)


@dataclass(frozen=True)
class Resolved:
    """One Hugging Face module's adapter, placed on gptzoo's weight."""

    module: str
    weight: str
    """Our weight's name in the model (``blocks.0.attn.c_attn.weight``)."""
    index: Tensor
    """Our weight's rows that the module's rows are, in its order."""
    a: Tensor
    b: Tensor
    magnitude: Tensor | None
    scale: float


def resolve(model: GPT, adapter: PeftAdapter, registry: Registry | None = None) -> list[Resolved]:
    """Where each module of ``adapter`` lands in ``model``, every shape checked.

    Raises:
        CheckpointError: the adapter is for another model: a module the model lacks, shapes that differ.
    """
    rows = hf_rows(model, registry)
    where: dict[str, tuple[str, TensorMap, int]] = {}  # their module -> our weight, its map, which of theirs
    for ours, theirs, tmap in rows:
        if ours.endswith(".weight"):
            for i, key in enumerate(theirs):
                where[_module(key)] = (ours, tmap, i)
    suffix = r"\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
    modules = sorted({re.sub(suffix, "", k) for k in adapter.tensors})
    state = dict(model.named_parameters())
    problems, disagree, resolved = [], [], []
    for full in modules:
        module = full.removeprefix(PREFIX)
        a = adapter.tensors.get(full + ".lora_A.weight")
        b = adapter.tensors.get(full + ".lora_B.weight")
        found = where.get(module)
        if found is None:
            near = sorted(where)[:4]
            problems.append(f"{module} is not a linear layer of this model (it has e.g. {', '.join(near)})")
            continue
        if a is None or b is None:
            problems.append(f"{module} lacks its {'lora_A' if a is None else 'lora_B'} weight")
            continue
        ours, tmap, i = found
        if tmap.stack or (tmap.transpose and tmap.groups > 1):
            problems.append(f"{module} is a slice of a stacked Hugging Face tensor, which gptzoo cannot adapt")
            continue
        weight = state[ours]
        index = row_indices(tmap, weight.shape[0])[i]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != weight.shape[1] or tuple(b.shape) != (len(index), a.shape[0]):
            problems.append(
                f"{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit its weight "
                f"({len(index)} x {weight.shape[1]})"
            )
            continue
        if disagreement := _disagreement(adapter, module, a, full + ".lora_magnitude_vector" in adapter.tensors):
            disagree.append(disagreement)
            continue
        magnitude = adapter.tensors.get(full + ".lora_magnitude_vector")
        if magnitude is not None and tuple(magnitude.shape) != (len(index),):
            problems.append(f"{module}: its DoRA magnitude has {tuple(magnitude.shape)}, not ({len(index)},)")
            continue
        bad = [
            name
            for name, t in (("lora_A", a), ("lora_B", b), ("magnitude", magnitude))
            if t is not None and not torch.isfinite(t).all()
        ]
        if bad:
            problems.append(f"{module}: its {' and '.join(bad)} hold NaN or infinite values")
            continue
        resolved.append(Resolved(module, ours, index, a.float(), b.float(), _float(magnitude), adapter.scale(module)))
    if disagree:
        raise CheckpointError(
            f"--adapter {adapter.path}: its tensors and {CONFIG} disagree, so peft refuses it or applies it otherwise "
            f"than its tensors say: {'; '.join(disagree[:4])}"
            + (f"; and {len(disagree) - 4} more" if len(disagree) > 4 else "")
            + f"; fix {CONFIG} (or save the adapter again with peft)"
        )
    if problems:
        raise CheckpointError(
            f"--adapter {adapter.path} does not fit this model (is it for another base model? its "
            f"base_model_name_or_path is {adapter.config.get('base_model_name_or_path')!r}): "
            + "; ".join(problems[:4])
            + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        )
    return resolved


def _targeted(config: Mapping[str, Any], module: str) -> bool:
    """Whether peft applies an adapter to ``module`` (``model.layers.0.self_attn.q_proj``): its target_modules
    name it (a list: the module or its last names; a string: a regular expression the whole name matches)."""
    targets = config.get("target_modules")
    if targets is None or targets == "all-linear":
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(isinstance(t, str) and (module == t or module.endswith("." + t)) for t in targets)


def _disagreement(adapter: PeftAdapter, module: str, a: Tensor, magnitude: bool) -> str | None:
    """How the module's tensors and adapter_config.json disagree, where peft would refuse the directory or read
    it otherwise than its tensors say; None when they agree."""
    config = adapter.config
    if not _targeted(config, module):
        return f"{module} has tensors, but target_modules ({config.get('target_modules')!r}) does not name it"
    rank = _pattern(config.get("rank_pattern") or {}, module, config.get("r", 8))
    if a.shape[0] != rank:
        return f"{module}: its lora_A has rank {a.shape[0]}, but {CONFIG} gives it r={rank}"
    dora = bool(config.get("use_dora"))
    if magnitude != dora:
        has = "has no DoRA magnitude" if dora else "has a DoRA magnitude"
        return f"{module} {has}, but {CONFIG} says use_dora={str(dora).lower()}"
    return None


def _float(t: Tensor | None) -> Tensor | None:
    return t.float() if t is not None else None


@torch.no_grad()
def merge_peft(model: GPT, adapter: PeftAdapter, registry: Registry | None = None) -> list[str]:
    """Add the adapter to the model's weights (float32 arithmetic, stored in the weights' dtype); the Hugging
    Face modules adapted. Every module is checked before any weight changes (:func:`resolve`)."""
    _merge(model, resolve(model, adapter, registry))
    return _names(adapter)


def _merge(model: GPT, resolved: list[Resolved]) -> None:
    """W + scale B A on each module's rows of our weight; DoRA: those rows rescaled to the magnitudes."""
    state = dict(model.named_parameters())
    for r in resolved:
        weight = state[r.weight]
        rows = weight[r.index].float() + r.scale * (r.b @ r.a)
        if r.magnitude is not None:
            rows = rows * (r.magnitude / rows.norm(dim=1)).unsqueeze(1)
        weight[r.index] = rows.to(weight.dtype)


def _names(adapter: PeftAdapter) -> list[str]:
    suffix = r"\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
    return sorted({re.sub(suffix, "", k).removeprefix(PREFIX) for k in adapter.tensors})


@torch.no_grad()
def attach_peft(model: GPT, adapter: PeftAdapter, registry: Registry | None = None) -> list[str]:
    """The adapter as a low-rank side path: each adapted projection becomes a LoRALinear computing what peft's
    unmerged layers compute (its own rank and scale per module); a module whose rows are not one contiguous
    range of ours (an interleaving layout) is merged instead. The modules adapted."""
    dora = bool(adapter.config.get("use_dora"))
    by_linear: dict[str, list[Resolved]] = {}
    merged = []
    for r in resolve(model, adapter, registry):
        n = len(r.index)
        start = int(r.index[0]) if n else 0
        if n and bool((r.index == torch.arange(start, start + n)).all()) and (r.magnitude is not None) == dora:
            by_linear.setdefault(r.weight.removesuffix(".weight"), []).append(r)
        else:
            merged.append(r)
    for path, found in by_linear.items():
        parent_path, _, attribute = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        base = getattr(parent, attribute)
        parts = [(r.module.rpartition(".")[2], int(r.index[0]), int(r.index[0]) + len(r.index)) for r in found]
        wrapper = LoRALinear(base, [], LoRASpec(rank=1, dora=dora))
        wrapper.parts = sorted(parts, key=lambda p: p[1])
        for (name, _, _), r in zip(parts, found, strict=True):
            wrapper.lora_A[name] = torch.nn.Parameter(r.a.to(base.weight.device), requires_grad=False)
            wrapper.lora_B[name] = torch.nn.Parameter(r.b.to(base.weight.device), requires_grad=False)
            if r.magnitude is not None:
                wrapper.lora_magnitude[name] = torch.nn.Parameter(r.magnitude, requires_grad=False)
            wrapper.scales[name] = r.scale
        setattr(parent, attribute, wrapper)
    _merge(model, merged)
    return _names(adapter)


@dataclass(frozen=True)
class PeftSides:
    """An adapter directory in peft's format on both sides of gptzoo.hf.compare.compare (``--adapter``):
    gptzoo's own reading on gptzoo's (as ``gptzoo generate --adapter`` loads it), peft on transformers'."""

    directory: str

    @classmethod
    def given(cls, text: str) -> PeftSides:
        """``--adapter [NAME=]DIR``, by :func:`split_adapter`'s rule."""
        return cls(split_adapter(text)[1])

    def gptzoo(self, model: GPT, registry: Registry | None) -> GPT:
        attach_peft(model, read_peft(Path(self.directory)), registry)
        return model

    def transformers(self, model: Any) -> Any:
        try:
            from peft import PeftModel
        except ImportError:
            raise GptzooError(
                "compare --adapter runs peft on transformers' side: install it (pip install peft)"
            ) from None
        return PeftModel.from_pretrained(model, self.directory).eval()

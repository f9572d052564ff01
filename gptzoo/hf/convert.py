"""Checkpoints <-> models: which family reads a config.json (:data:`FAMILIES`), the recipe it derives
(:func:`hf_recipe`), a checkpoint loaded into a gptzoo model (:func:`load_hf`) and a gptzoo model exported
as one (:func:`export_hf`); each family's own maps live in its module (see family.py for how maps are owned).
"""

from __future__ import annotations

import functools
import inspect
import math
import tempfile
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptzoo import plugin_code
from gptzoo.defaults import WEIGHT_DTYPES
from gptzoo.errors import CheckpointError, GptzooError, Interrupted, RecipeError, did_you_mean
from gptzoo.hf.deepseek import DeepseekV2, DeepseekV3
from gptzoo.hf.family import Family, NoEquivalentError, show
from gptzoo.hf.files import Checkpoint, open_checkpoint, read_tensors, write_checkpoint
from gptzoo.hf.gemma import Gemma2, Gemma3
from gptzoo.hf.gpt2 import GPT2
from gptzoo.hf.gpt_neox import GPTNeoX
from gptzoo.hf.gpt_oss import GptOss
from gptzoo.hf.granite_hybrid import GraniteHybrid
from gptzoo.hf.kimi_linear import KimiLinear
from gptzoo.hf.lfm2 import Lfm2
from gptzoo.hf.llama import Llama
from gptzoo.hf.mistral import Mistral
from gptzoo.hf.mixtral import Mixtral
from gptzoo.hf.olmo2 import Olmo2
from gptzoo.hf.olmo_hybrid import OlmoHybrid
from gptzoo.hf.olmoe import Olmoe
from gptzoo.hf.phi3 import Phi3
from gptzoo.hf.qwen import Qwen2, Qwen3
from gptzoo.hf.qwen3_5 import Qwen3_5, Qwen3_5VisionLanguage
from gptzoo.hf.qwen3_next import Qwen3Next
from gptzoo.hf.qwen_moe import Qwen2Moe, Qwen3Moe
from gptzoo.hf.smollm3 import SmolLM3
from gptzoo.hf.tensor_map import TensorMap, stack_slices
from gptzoo.model.build import assemble, build_model
from gptzoo.model.checkpoint import tokenizer_copies
from gptzoo.model.gpt import GPT
from gptzoo.recipe import COMPONENT_KEYS, ModelSpec, Recipe, apply_overrides, entry_of, recipe_tokenizer, validate
from gptzoo.recipe.schema import LAYER_TYPES
from gptzoo.registry import Entry, Registry, default_registry
from gptzoo.tokenizer import save_hf_tokenizer
from gptzoo.untrusted import WEIGHT_DTYPES_TEXT, dtype_name, first_few

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        GPT2(),
        Llama(),
        Gemma3(),
        Gemma2(),
        Qwen2(),
        Qwen3(),
        Mistral(),
        GPTNeoX(),
        Phi3(),
        Olmo2(),
        Mixtral(),
        Qwen2Moe(),
        Qwen3Moe(),
        Olmoe(),
        DeepseekV2(),
        DeepseekV3(),
        GptOss(),
        Lfm2(),
        Qwen3_5(),
        Qwen3_5VisionLanguage(),
        Qwen3Next(),
        OlmoHybrid(),
        GraniteHybrid(),
        KimiLinear(),
        SmolLM3(),
    )
}
"""config.json model_type -> family."""

__all__ = [
    "FAMILIES",
    "NoEquivalentError",
    "check_recipe_matches",
    "export_hf",
    "family_for",
    "hf_recipe",
    "load_hf",
]


def family_for(config: dict[str, Any], source: Path) -> Family:
    model_type = config.get("model_type")
    if model_type is None:
        raise CheckpointError(
            f"{source}/config.json has no model_type; gptzoo reads checkpoints of model_type {', '.join(FAMILIES)}"
        )
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise CheckpointError(
            f"{source}/config.json: model_type {show(model_type)} is not supported"
            f"{did_you_mean(str(model_type), list(FAMILIES))}"
        )
    return FAMILIES[model_type]


def hf_recipe(
    source: str | Path | Checkpoint, overrides: Iterable[str] = (), *, registry: Registry | None = None
) -> Recipe:
    """The recipe equivalent to a checkpoint's config.json (unsupported fields are errors), with
    ``--set`` style overrides applied (e.g. ``model.attention=eager``)."""
    checkpoint = open_checkpoint(source)
    path, config, source = checkpoint.path, checkpoint.config, checkpoint.source
    family = family_for(config, path)
    try:
        data = family.recipe_data(config)
    except GptzooError as exc:
        raise RecipeError(str(path / "config.json"), [str(exc)]) from None
    except (TypeError, ValueError, ZeroDivisionError, KeyError, IndexError, AttributeError) as exc:
        raise RecipeError(
            str(path / "config.json"), [f"a malformed value ({type(exc).__name__}: {exc}); fix config.json"]
        ) from None
    data["description"] = f"{family.architecture} from {source}"
    data, problems = apply_overrides(data, overrides)
    name = Path(str(source)).name or str(source)
    return validate(data, str(path / "config.json"), name=name, registry=registry, problems=problems)


def check_recipe_matches(recipe: Recipe, derived: Recipe, registry: Registry) -> None:
    """Every [model] value the checkpoint determines must agree: the sizes, and the components each
    layer uses (with their parameters, factory defaults filled in), however the two schedules are
    written. Attentions are compared by parameters only: their kernels may differ (causal, eager,
    sliding_window with the same window)."""
    problems = []
    for f in fields(ModelSpec):
        if f.name in COMPONENT_KEYS or f.name in ("layer_pattern", LAYER_TYPES, "init_std"):
            continue
        ours, theirs = getattr(recipe.model, f.name), getattr(derived.model, f.name)
        if not _same(ours, theirs):
            problems.append(f"[model] {f.name}: the recipe says {_show(ours)}, {derived.source} says {_show(theirs)}")
    if recipe.model.n_layer == derived.model.n_layer:
        problems += _layer_problems(recipe, derived, registry)
    if problems:
        raise RecipeError(recipe.source, problems)


def _layer_problems(recipe: Recipe, derived: Recipe, registry: Registry) -> list[str]:
    """Each component that some layer uses differently, once per component and layer type of the recipe."""
    pairs: dict[tuple[str, str], int] = {}  # (recipe's layer type, checkpoint's) -> its first layer
    for i, pair in enumerate(zip(recipe.model.schedule(), derived.model.schedule(), strict=True)):
        pairs.setdefault(pair, i)
    problems: list[str] = []
    for kind in COMPONENT_KEYS:
        reported: set[str] = set()
        for (mine, theirs), i in pairs.items():
            ours = _effective(kind, recipe.model.layer_components(mine)[kind], registry)
            them = _effective(kind, derived.model.layer_components(theirs)[kind], registry)
            if kind == "attention":
                ours, them = ("", ours[1]), ("", them[1])
            if not _same(ours, them) and mine not in reported:
                reported.add(mine)
                where = f"[model] {kind}" if not mine else f"[model] {LAYER_TYPES}.{mine}.{kind} (layer {i})"
                problems.append(f"{where}: the recipe says {_show(ours)}, {derived.source} says {_show(them)}")
    return problems


def _effective(kind: str, component: Any, registry: Registry) -> tuple[str, dict[str, Any]]:
    """A component with its factory's defaults filled in, so `rmsnorm` equals `{rmsnorm, eps=1e-6}`."""
    entry = entry_of(kind, component, registry)
    signature = plugin_code.signature(entry)
    params = {
        p.name: p.default
        for p in (signature.parameters.values() if signature is not None else ())
        if p.default is not inspect.Parameter.empty
    }
    return entry.qualified_name, {**params, **component.kwargs}  # gptzoo:rmsnorm is rmsnorm


def _same(a: Any, b: Any) -> bool:
    """Equal, with floats compared to float32 precision (configs often carry float32-rounded eps)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0] and a[1].keys() == b[1].keys() and all(_same(a[1][k], b[1][k]) for k in a[1])
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def _tensors(keys: list[str]) -> str:
    """Tensor names for a message: one, or the first three and how many there are."""
    return keys[0] if len(keys) == 1 else f"{len(keys)} tensors ({first_few(keys, 3, ', ')})"


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        name, params = value
        return f"{name} {params}".strip() if params else name or "(defaults)"
    return repr(value)


def load_hf(
    source: str | Path | Checkpoint,
    recipe: Recipe | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
) -> GPT:
    """A gptzoo model with a Hugging Face checkpoint's weights; every tensor must be accounted for.

    Args:
        source: a checkpoint directory, a fetchable name or a hub name.
        recipe: the recipe to build; it must agree with config.json. Default: derived from it.
        dtype: of the returned model; default: float32.
    """
    registry = registry if registry is not None else default_registry()
    checkpoint = open_checkpoint(source)
    path = checkpoint.path
    derived = hf_recipe(checkpoint, registry=registry)
    if recipe is None:
        recipe = derived
    else:
        check_recipe_matches(recipe, derived, registry)
    family = family_for(checkpoint.config, path)
    model = build_model(recipe, device="meta", registry=registry)
    rows = family.tensor_map(model, registry)
    tensors = read_tensors(path)
    refused: dict[str, list[str]] = {}  # dtype -> its tensors, found before any arithmetic (float8 has little)
    for key, t in tensors.items():
        if dtype_name(t.dtype) not in WEIGHT_DTYPES and not key.endswith(family.ignored_tensors):
            refused.setdefault(dtype_name(t.dtype), []).append(key)
    if refused:
        problems = [f"{_tensors(keys)} {'has' if len(keys) == 1 else 'have'} dtype {d}" for d, keys in refused.items()]
        raise CheckpointError(
            f"{path} does not fit {family.architecture} {recipe.name!r}: {'; '.join(problems)}, expected "
            f"{WEIGHT_DTYPES_TEXT}"
        )
    tensors = family.normalize(tensors, model, path)
    reference = model.state_dict()
    dtype = dtype or torch.float32
    state, used, problems = {}, set(), []

    @functools.cache
    def finite(key: str) -> bool:  # once per tensor, which the slices of a stacked one share
        return bool(torch.isfinite(tensors[key]).all())

    for ours, theirs, tmap in rows:
        missing = [key for key in theirs if key not in tensors]
        used.update(key for key in theirs if key in tensors)  # reported as wrong (if they are), not as unexpected
        if missing:
            problems += [f"missing tensor {key}" for key in missing]
            continue
        expected = tmap.shapes(tuple(reference[ours].shape))
        wrong = [
            f"{key} has shape {tuple(tensors[key].shape)}, expected {shape}"
            for key, shape in zip(theirs, expected, strict=True)
            if tuple(tensors[key].shape) != shape
        ]
        wrong += [f"{key} holds NaN or infinite values" for key in theirs if not finite(key)]
        if wrong:
            problems += wrong
            continue
        state[ours] = tmap.load([tmap.select(tensors[key]) for key in theirs]).to(device=device or "cpu", dtype=dtype)
    problems = list(dict.fromkeys(problems))  # a stacked tensor's problem once, not once a slice
    problems += [f"unexpected tensor {key}" for key in sorted(set(tensors) - used)]
    if problems:
        raise CheckpointError(f"{path} does not fit {family.architecture} {recipe.name!r}: {first_few(problems)}")
    model.load_weights(state, source=str(path))
    model.recipe = recipe
    return model


def export_hf(
    model: GPT, out: str | Path, *, tokenizer_from: str | Path | None = None, registry: Registry | None = None
) -> Path:
    """Write config.json + model.safetensors that transformers loads with the same logits, and the
    Hugging Face tokenizer files of the directory ``tokenizer_from`` if it has them (the gptzoo
    checkpoint the model came from: ``gptzoo build --hf`` copies them there), else, for a recipe's
    "gpt2" or "bytes" tokenizer whose ids the model has, files that encode as it does
    (gptzoo.tokenizer.save_hf_tokenizer). config.json's bos_token_id and eos_token_id are those of the
    recipe's tokenizer (:func:`_special_token_ids`).

    The first family in FAMILIES' order (GPT-2, Llama, Gemma 3, Gemma 2, Qwen2, Qwen3, Mistral, GPT-NeoX,
    Phi-3, OLMo 2) that every component of the recipe has an equivalent in is written: each
    component's layout there places its tensors and gives the config.json fields it owns
    (gptzoo.hf.layouts, gptzoo.hf.family.Family.config); ``registry`` (default: the shared one) builds
    the recipe's components on the meta device to ask them, and holds the plugins' layouts.

    Raises:
        NoEquivalentError: no Hugging Face architecture expresses the recipe.
        CheckpointError: ``out`` cannot be written, a tokenizer file is not one the directory may supply.
        Interrupted: Ctrl-C (nothing is left behind).
    """
    try:
        return _export(model, Path(out), tokenizer_from, registry if registry is not None else default_registry())
    except KeyboardInterrupt:
        raise Interrupted(f"nothing was written to {out}") from None


def _export(model: GPT, out: Path, tokenizer_from: str | Path | None, registry: Registry) -> Path:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    recipe = model.recipe
    if recipe is None:
        raise GptzooError("the model has no recipe; build it with gptzoo.build_model or load a checkpoint")
    family, config_fields, rows = equivalent(recipe, registry)
    copies = tokenizer_copies(tokenizer_from)
    config_fields.update(_special_token_ids(recipe, Path(tokenizer_from) if copies else None))
    state = model.state_dict()
    unmapped = sorted(set(state) - {ours for ours, _, _ in rows} - ({"lm_head.weight"} if model.tied else set()))
    if unmapped:
        raise CheckpointError(
            f"the model holds {first_few(unmapped)}, which a model of its recipe has not (adapters not merged, or a "
            f"module changed after it was built), so {family.architecture} would not hold them; merge or remove "
            f"them, then export (nothing was written to {out})"
        )
    config = transformers.AutoConfig.for_model(
        family.model_type, **config_fields, architectures=[family.architecture], dtype=model.wte.weight.dtype
    )
    saved = [
        (tmap, key, t) for ours, theirs, tmap in rows for key, t in zip(theirs, tmap.save(state[ours]), strict=True)
    ]
    try:
        tensors = stack_slices(saved)
    except ValueError as exc:
        raise CheckpointError(f"the {family.architecture} weight map is incomplete: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="gptzoo-tokenizer-") as made:
        if not copies and recipe.tokenizer is not None and recipe.tokenizer.name != "hf":
            if recipe_tokenizer(recipe, None).vocab_size <= recipe.model.vocab_size:  # its ids are the model's
                copies = save_hf_tokenizer(recipe.tokenizer.name, Path(made))
        return write_checkpoint(out, config, tensors, copies)


def equivalent(
    recipe: Recipe, registry: Registry
) -> tuple[Family, dict[str, Any], list[tuple[str, tuple[str, ...], TensorMap]]]:
    """The family a model of ``recipe`` exports to (the first in FAMILIES' order that expresses every
    component), its config.json fields and its tensor map (of a model built on the meta device).

    Raises:
        NoEquivalentError: none does; the message is the closest family's reasons.
    """
    components: list[tuple[Entry, nn.Module]] = []
    skeleton = assemble(recipe, registry, torch.device("meta"), components)
    reasons: list[tuple[int, str, str]] = []
    for family in (f for f in FAMILIES.values() if f.exports):
        try:
            config_fields = family.config(recipe, skeleton, components, registry)
            rows = family.tensor_map(skeleton, registry)
        except NoEquivalentError as exc:
            reasons.append((len(exc.reasons), family.title, str(exc)))
            continue
        return family, config_fields, rows
    _, title, closest = min(reasons, key=lambda r: r[0])  # the first of the closest families
    others = [t for _, t, _ in reasons if t != title]
    raise NoEquivalentError(f"{closest}; {', '.join(others)} differ at least as much" if others else closest)


def _special_token_ids(recipe: Recipe, tokenizer_dir: Path | None) -> dict[str, int | None]:
    """config.json's bos_token_id and eos_token_id: the ids of the recipe's tokenizer (for "hf", of
    the Hugging Face tokenizer files in ``tokenizer_dir``), where it has them and they are ids of the
    model; None otherwise (the bytes tokenizer has neither; transformers' own defaults, GPT-2's 50256,
    would name ids a smaller vocabulary lacks)."""
    name = recipe.tokenizer.name if recipe.tokenizer is not None else "hf"
    if name == "hf" and tokenizer_dir is None:
        return {"bos_token_id": None, "eos_token_id": None}
    tokenizer = recipe_tokenizer(recipe, tokenizer_dir)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return {key: i if i is not None and 0 <= i < recipe.model.vocab_size else None for key, i in ids.items()}

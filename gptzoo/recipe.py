"""Recipes: TOML -> resolved data (extends, overrides) -> validated, frozen :class:`Recipe`.

A recipe names components by registry key, either as a string (``norm = "rmsnorm"``) or as a table
whose other keys are the component's parameters (``norm = { name = "layernorm", eps = 1e-5 }``).
``extends = "NAME_OR_PATH"`` inherits from another recipe: each section's keys override the
parent's (a component value is replaced whole). Overrides ``model.n_layer=6`` apply last; their
values are parsed as TOML, falling back to a bare string (``model.norm=rmsnorm``).

Validation reports every problem at once, each with its key path; nothing is built from a recipe
that has one.
"""

from __future__ import annotations

import inspect
import json
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, get_type_hints

from gptzoo.errors import RecipeError, UnknownComponentError, did_you_mean
from gptzoo.registry import Registry, get_registry

MAX_DIM = 2**31 - 1
"""The largest value of any [model] dimension (an int32 index)."""
NORM_PLACEMENTS = ("pre", "post")
"""pre: x + F(norm(x)) with a final norm (GPT-2); post: norm(x + F(x)), no final norm (Vaswani et al.)."""


@dataclass(frozen=True)
class Component:
    """A registry key and the keyword parameters its factory gets from the recipe."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    """(parameter, value) pairs in recipe order: immutable, hashable and copyable."""

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_toml_value(self) -> str | dict[str, Any]:
        return {"name": self.name, **self.kwargs} if self.params else self.name


@dataclass(frozen=True)
class ModelSpec:
    """The [model] section. Names follow the GPT-2 checkpoints (n_embd, n_head, n_layer)."""

    vocab_size: int
    context_length: int
    n_layer: int
    n_head: int
    n_embd: int
    d_ff: int
    bias: bool
    tie_embeddings: bool
    norm: Component
    activation: Component
    mlp: Component
    position: Component
    attention: Component
    norm_placement: str = "pre"
    n_kv_head: int = 0
    """Key/value heads; 0 (the default) means n_head (MHA)."""
    head_dim: int = 0
    """Per-head dimension; 0 (the default) means n_embd // n_head."""
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if not self.n_kv_head:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if not self.head_dim and self.n_head:
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)


@dataclass(frozen=True)
class TokenizerSpec:
    """The [tokenizer] section: "gpt2" (tiktoken, offline), "bytes" (UTF-8 bytes) or "hf" (the checkpoint's own)."""

    name: str


@dataclass(frozen=True)
class GenerateSpec:
    """The [generate] section: the sampler chain, in order, and generation defaults."""

    samplers: tuple[Component, ...] = ()
    """e.g. ``[{ name = "temperature", temperature = 0.8 }, { name = "top_k", k = 50 }]``; empty: greedy."""
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    """Strings that end a row's text (they are not part of it)."""


@dataclass(frozen=True)
class WeightsSpec:
    """The [weights] section: where pretrained weights for exactly this recipe come from.
    Never inherited through ``extends`` (a smaller child is not the parent's checkpoint)."""

    hf: str
    """A Hugging Face checkpoint: a directory, a name gptzoo fetches, or a hub name."""


PRECISIONS = ("float32", "bfloat16", "float16")
"""float32; bfloat16 autocast (CPU and CUDA); float16 autocast with a GradScaler (CUDA only)."""
PARALLELISMS = ("ddp", "fsdp")
"""Under torchrun: DDP (a replica per process) or FSDP2 (parameters sharded with fully_shard)."""
ON_NONFINITE = ("stop", "skip")
"""A non-finite loss or gradient norm: stop the run, or skip that optimizer step."""


@dataclass(frozen=True)
class TrainSpec:
    """The [train] section; names follow nanoGPT's train.py where it has one.

    One optimizer step sees micro_batch_size x grad_accum x (number of processes) sequences of
    seq_len tokens. The learning rate rises linearly to lr over warmup_steps, then follows a cosine
    down to min_lr at max_steps. AdamW decays only matrices (weight_decay), never biases, norms or
    embeddings."""

    max_steps: int = 1000
    micro_batch_size: int = 8
    grad_accum: int = 1
    seq_len: int = 0
    """Tokens per training sequence; 0 (the default) means the model's context_length."""
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off."""
    precision: str = "float32"
    compile: bool = False
    eval_every: int = 100
    """Steps between evaluations of the validation loss (also at the last step); 0: only at the end."""
    eval_batches: int = 20
    checkpoint_every: int = 0
    """Steps between checkpoints (also at the last step); 0: only at the end."""
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 1337
    on_nonfinite: str = "stop"
    parallel: str = "ddp"
    peak_tflops: float = 0.0
    """The device's peak FLOP/s (in TFLOP/s) that MFU is measured against; 0: measure it with a matmul."""
    data: str = ""
    """The prepared data directory (`gptzoo prepare`), relative to the recipe file; --data overrides."""



@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    model: ModelSpec
    tokenizer: TokenizerSpec | None = None
    weights: WeightsSpec | None = None
    generate: GenerateSpec = GenerateSpec()
    train: TrainSpec = TrainSpec()
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as TOML data (no extends; every default spelled out)."""
        model = {f.name: getattr(self.model, f.name) for f in fields(ModelSpec)}
        for key, value in model.items():
            if isinstance(value, Component):
                model[key] = value.to_toml_value()
        # Defaults stay implicit, so that `--set model.n_embd=...` on a written recipe still derives them.
        if model["n_kv_head"] == model["n_head"]:
            del model["n_kv_head"]
        if model["head_dim"] == model["n_embd"] // model["n_head"]:
            del model["head_dim"]
        data: dict[str, Any] = {"description": self.description, "model": model} if self.description else {"model": model}
        if self.tokenizer is not None:
            data["tokenizer"] = {"name": self.tokenizer.name}
        if self.weights is not None:
            data["weights"] = {"hf": self.weights.hf}
        if self.generate != GenerateSpec():
            g = self.generate
            data["generate"] = {"samplers": [{"name": c.name, **c.kwargs} for c in g.samplers], "max_new_tokens": g.max_new_tokens, "stop": list(g.stop)}
        if self.train != TrainSpec():
            data["train"] = {f.name: getattr(self.train, f.name) for f in fields(TrainSpec) if getattr(self.train, f.name) != f.default}
        return data

    def to_toml(self) -> str:
        return dump_toml(self.to_dict())


SECTIONS: dict[str, type] = {"model": ModelSpec, "tokenizer": TokenizerSpec, "weights": WeightsSpec, "generate": GenerateSpec, "train": TrainSpec}
TOP_LEVEL_KEYS = ("extends", "description")
COMPONENT_KEYS = ("norm", "activation", "mlp", "position", "attention")
"""[model] keys that name a component; each key is also the component's registry kind."""


# --- finding recipes ---------------------------------------------------------------------------


def recipes_dir() -> Path:
    """The directory of shipped recipes (the ``gptzoo_recipes`` package)."""
    return Path(str(resources.files("gptzoo_recipes")))


def shipped_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.toml"))}


def resolve_recipe_path(name_or_path: str | Path, *, relative_to: Path | None = None) -> Path:
    """A recipe file: an existing path (relative to ``relative_to`` if given), or a shipped name."""
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    if relative_to is not None and not candidate.is_absolute():
        candidate = relative_to / candidate
    if candidate.is_file():
        return candidate.resolve()
    if candidate.is_dir():
        raise RecipeError(text, [f"{str(candidate)!r} is a directory, not a recipe file"])
    shipped = shipped_recipes()
    if text in shipped:
        return shipped[text]
    if text.endswith(".toml") or "/" in text or "\\" in text:
        raise RecipeError(text, [f"no such recipe file {str(candidate)!r}"])
    raise RecipeError(text, [f"unknown recipe {text!r}{did_you_mean(text, list(shipped))}"])


# --- reading: extends and overrides ------------------------------------------------------------


def read_recipe_data(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The TOML of ``path`` merged over everything it extends (without the ``extends`` key)."""
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise RecipeError(str(_chain[0]), [f"extends cycle: {cycle}"])
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(str(path), [f"invalid TOML: {exc}"]) from None
    except OSError as exc:
        raise RecipeError(str(path), [f"cannot read: {exc.strerror}"]) from None
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise RecipeError(str(path), [f"extends must be a recipe name or path, got {parent!r}"])
    try:
        parent_path = resolve_recipe_path(parent, relative_to=path.parent)
    except RecipeError as exc:
        raise RecipeError(str(path), [f"extends = {parent!r}: {problem}" for problem in exc.problems]) from None
    base = read_recipe_data(parent_path, (*_chain, path))
    base.pop("weights", None)
    return merge(base, data)


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Child over base, section by section; values (components included) are replaced whole."""
    merged = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key in SECTIONS:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """'model.n_layer=6' -> (['model', 'n_layer'], 6); values are TOML, else a bare string.

    Raises ValueError with the problem for anything that is not SECTION.KEY[.PARAM]=VALUE.
    """
    key, sep, value = text.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not 2 <= len(path) <= 3 or not all(path):
        raise ValueError(f"--set {text!r} is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return path, parsed


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The data with every override applied, and the problems of those that could not be."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    problems = []
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        section = data.setdefault(path[0], {})
        if not isinstance(section, dict):
            problems.append(f"--set {text!r}: {path[0]!r} is not a section")
        elif len(path) == 2:
            section[path[1]] = value
        else:  # a component parameter: model.norm.eps=1e-6
            current = section.get(path[1])
            component = dict(current) if isinstance(current, dict) else {"name": current}
            component[path[2]] = value
            section[path[1]] = component
    return data, problems


# --- validation ----------------------------------------------------------------------------------

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _type_ok(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


class _Validator:
    """Collects every problem of one recipe."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.problems: list[str] = []

    def section(self, name: str, cls: type, data: Any) -> dict[str, Any] | None:
        if not isinstance(data, dict):
            self.problems.append(f"[{name}] must be a table, got {_describe(data)}")
            return None
        hints = get_type_hints(cls)
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key in data:
            if key not in known:
                self.problems.append(f"[{name}] unknown key {key!r}{did_you_mean(key, list(known))}")
        for key, f in known.items():
            if key not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    self.problems.append(f"[{name}] {key} is missing")
                continue
            expected = hints[key]
            value = data[key]
            if expected is Component:
                component = self.component(name, key, value)
                if component is not None:
                    values[key] = component
            elif not _type_ok(value, expected):
                self.problems.append(f"[{name}] {key} must be {_TYPE_NAMES[expected]}, got {_describe(value)}")
            else:
                values[key] = float(value) if expected is float else value
        return values

    def component(self, section: str, key: str, value: Any, *, kind: str | None = None) -> Component | None:
        where = f"[{section}] {key}"
        kind = kind or key
        if isinstance(value, str):
            name, params = value, {}
        elif isinstance(value, dict) and isinstance(value.get("name"), str):
            params = {k: v for k, v in value.items() if k != "name"}
            name = value["name"]
        else:
            self.problems.append(
                f"{where} must be a component name or a table {{ name = \"...\", ... }}, got {_describe(value)}"
            )
            return None
        try:
            factory = self.registry.get(kind, name).factory
        except UnknownComponentError as exc:
            self.problems.append(f"{where}: {exc}")
            return None
        before = len(self.problems)
        self.component_params(kind, where, name, factory, params)
        return Component(name, tuple(params.items())) if len(self.problems) == before else None

    def model(self, values: dict[str, Any]) -> ModelSpec | None:
        """Check dimensions; with a complete, consistent [model], check component parameters."""
        before = len(self.problems)
        for key, low in (*((k, 1) for k in ("vocab_size", "context_length", "n_layer", "n_head", "n_embd", "d_ff")), ("n_kv_head", 0), ("head_dim", 0)):
            if key in values and not low <= values[key] <= MAX_DIM:
                default = " (or 0 for the default)" if low == 0 else ""
                self.problems.append(f"[model] {key}={values[key]} must be between {max(low, 1)} and {MAX_DIM}{default}")
                del values[key]
        if "init_std" in values and not (values["init_std"] > 0 and math.isfinite(values["init_std"])):
            self.problems.append(f"[model] init_std={values['init_std']} must be a positive number")
        placement = values.get("norm_placement")
        if placement is not None and placement not in NORM_PLACEMENTS:
            self.problems.append(
                f"[model] norm_placement={placement!r} must be one of {', '.join(map(repr, NORM_PLACEMENTS))}"
            )
        n_embd, n_head = values.get("n_embd"), values.get("n_head")
        if n_embd and n_head and not values.get("head_dim") and n_embd % n_head:
            self.problems.append(
                f"[model] n_embd={n_embd} is not divisible by n_head={n_head} (or set head_dim explicitly)"
            )
        n_kv_head = values.get("n_kv_head")
        if n_head and n_kv_head and n_head % n_kv_head:
            self.problems.append(f"[model] n_head={n_head} is not divisible by n_kv_head={n_kv_head}")
        required = {f.name for f in fields(ModelSpec) if f.default is MISSING}
        if len(self.problems) > before or not required <= values.keys():
            return None
        spec = ModelSpec(**values)
        self.component_checks(spec)
        return spec

    def component_params(self, kind: str, where: str, name: str, factory: Any, params: dict[str, Any]) -> None:
        """Check the recipe's parameters against the factory's signature and the defaults' types."""
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # a builtin without a signature: the factory will judge
            return
        given_by_model = {arg for arg, _ in STRUCTURAL_ARGS.get(kind, ())} | set(COMPONENT_ARGS.get(kind, ()))
        accepted = {
            p.name: p
            for p in signature.parameters.values()
            if p.name not in given_by_model and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        for param, value in params.items():
            if param not in accepted:
                hint = did_you_mean(param, list(accepted)) if accepted else " (it takes none)"
                self.problems.append(f"{where}.{param}: {kind} {name!r} has no parameter {param!r}{hint}")
                continue
            default = accepted[param].default
            if default is not inspect.Parameter.empty and default is not None and not _type_ok(value, type(default)):
                expected = _TYPE_NAMES.get(type(default), type(default).__name__)
                self.problems.append(f"{where}.{param} must be {expected}, got {_describe(value)}")

    def generate(self, data: Any) -> GenerateSpec | None:
        if not isinstance(data, dict):
            self.problems.append(f"[generate] must be a table, got {_describe(data)}")
            return None
        before = len(self.problems)
        for key in data:
            if key not in ("samplers", "max_new_tokens", "stop"):
                self.problems.append(f"[generate] unknown key {key!r}{did_you_mean(key, ['samplers', 'max_new_tokens', 'stop'])}")
        samplers, stop = data.get("samplers", []), data.get("stop", [])
        max_new_tokens = data.get("max_new_tokens", 128)
        if not isinstance(samplers, list):
            self.problems.append(f"[generate] samplers must be a list of sampler names or tables, got {_describe(samplers)}")
            samplers = []
        steps = [self.component("generate", f"samplers[{i}]", value, kind="sampler") for i, value in enumerate(samplers)]
        if not _type_ok(max_new_tokens, int) or max_new_tokens < 1:
            self.problems.append(f"[generate] max_new_tokens must be an integer >= 1, got {_describe(max_new_tokens)}")
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            self.problems.append(f"[generate] stop must be a list of non-empty strings, got {_describe(stop)}")
        for i, step in enumerate(steps):
            if step is not None:  # samplers are cheap to build: let each judge its parameter values
                try:
                    sampler = self.registry.get("sampler", step.name).factory(**step.kwargs)
                except (TypeError, ValueError) as exc:
                    self.problems.append(f"[generate] samplers[{i}] ({step.name}): {exc}")
                    continue
                if getattr(sampler, "picks", False) and i != len(steps) - 1:
                    self.problems.append(f"[generate] samplers[{i}] ({step.name}) chooses the token, so it must come last")
        if len(self.problems) > before:
            return None
        return GenerateSpec(tuple(s for s in steps if s is not None), max_new_tokens, tuple(stop))

    def train(self, values: dict[str, Any], model: dict[str, Any] | None) -> TrainSpec | None:
        """Ranges and choices of [train]; seq_len against the model's context."""
        before = len(self.problems)
        for key in ("max_steps", "micro_batch_size", "grad_accum", "eval_batches", "keep_checkpoints", "log_every"):
            if key in values and values[key] < 1:
                self.problems.append(f"[train] {key}={values[key]} must be at least 1")
        for key in ("seq_len", "warmup_steps", "eval_every", "checkpoint_every", "seed"):
            if key in values and values[key] < 0:
                self.problems.append(f"[train] {key}={values[key]} must be 0 or more")
        for key in ("lr", "min_lr", "eps", "weight_decay", "grad_clip", "peak_tflops"):
            if key in values and not (values[key] >= 0 and math.isfinite(values[key])):
                self.problems.append(f"[train] {key}={values[key]} must be a finite number >= 0")
        for key in ("beta1", "beta2"):
            if key in values and not 0 <= values[key] < 1:
                self.problems.append(f"[train] {key}={values[key]} must be in [0, 1)")
        lr, min_lr = values.get("lr", TrainSpec.lr), values.get("min_lr", TrainSpec.min_lr)
        if isinstance(lr, float) and isinstance(min_lr, float) and min_lr > lr:
            self.problems.append(f"[train] min_lr={min_lr} is above lr={lr}")
        for key, choices in (("precision", PRECISIONS), ("on_nonfinite", ON_NONFINITE), ("parallel", PARALLELISMS)):
            if key in values and values[key] not in choices:
                self.problems.append(f"[train] {key}={values[key]!r} must be one of {', '.join(map(repr, choices))}{did_you_mean(values[key], list(choices))}")
        context = model.get("context_length") if model else None
        if isinstance(context, int) and values.get("seq_len", 0) > context:
            self.problems.append(f"[train] seq_len={values['seq_len']} is above the model's context_length={context}; lower seq_len")
        return TrainSpec(**values) if len(self.problems) == before else None

    def component_checks(self, spec: ModelSpec) -> None:
        """Run each factory's optional ``check`` on the complete model (e.g. rope's even head_dim)."""
        for kind in COMPONENT_KEYS:
            component: Component = getattr(spec, kind)
            check = getattr(self.registry.get(kind, component.name).factory, "check", None)
            if check is not None:
                for problem in check(**structural_args(spec, kind), **component.kwargs):
                    self.problems.append(f"[model] {kind} ({component.name}): {problem}")


STRUCTURAL_ARGS: dict[str, tuple[tuple[str, str], ...]] = {
    "norm": (("dim", "n_embd"),),
    "activation": (),
    "mlp": (("d_model", "n_embd"), ("d_ff", "d_ff"), ("bias", "bias")),
    "position": (("n_embd", "n_embd"), ("n_head", "n_head"), ("head_dim", "head_dim"), ("context_length", "context_length")),
    "attention": (("d_model", "n_embd"), ("n_head", "n_head"), ("n_kv_head", "n_kv_head"), ("head_dim", "head_dim"), ("bias", "bias")),
}
"""kind -> (factory argument, [model] attribute) pairs: what the model passes besides recipe parameters
(hookspecs.py documents each kind's factory signature)."""
COMPONENT_ARGS: dict[str, tuple[str, ...]] = {"mlp": ("activation",)}
"""Factory arguments that are themselves components, built and passed by the builder."""


def structural_args(spec: ModelSpec, kind: str) -> dict[str, Any]:
    """The arguments the model passes to a factory of this kind, beyond the recipe's parameters
    and the component arguments of COMPONENT_ARGS."""
    return {arg: getattr(spec, attr) for arg, attr in STRUCTURAL_ARGS[kind]}


def validate(
    data: dict[str, Any], source: str, *, name: str, registry: Registry | None = None, problems: Iterable[str] = ()
) -> Recipe:
    """A Recipe from resolved data, or a RecipeError listing every problem (after ``problems``
    found earlier, e.g. in overrides)."""
    v = _Validator(registry if registry is not None else get_registry())
    v.problems.extend(problems)
    for key in data:
        if key not in SECTIONS and key not in TOP_LEVEL_KEYS:
            v.problems.append(f"unknown section or key {key!r}{did_you_mean(key, [*SECTIONS, *TOP_LEVEL_KEYS])}")
    description = data.get("description", "")
    if not isinstance(description, str):
        v.problems.append(f"description must be a string, got {_describe(description)}")
    model_values = v.section("model", ModelSpec, data["model"]) if "model" in data else None
    if model_values is None and "model" not in data:
        v.problems.append("[model] section is missing")
    optional: dict[str, Any] = {}
    if "generate" in data:
        generate = v.generate(data["generate"])
        if generate is not None:
            optional["generate"] = generate
    if "train" in data:
        values = v.section("train", TrainSpec, data["train"])
        train = v.train(values, model_values) if values is not None else None
        if train is not None:
            optional["train"] = train
    for key in ("tokenizer", "weights"):
        if key in data:
            values = v.section(key, SECTIONS[key], data[key])
            if values is not None and len(values) == len(fields(SECTIONS[key])):
                optional[key] = SECTIONS[key](**values)
    model = v.model(model_values) if model_values is not None else None
    if v.problems or model is None:
        raise RecipeError(source, v.problems)
    return Recipe(name=name, source=source, model=model, description=description, **optional)


def load_recipe(
    name_or_path: str | Path, overrides: Iterable[str] = (), *, registry: Registry | None = None
) -> Recipe:
    """Load, merge (extends), override and validate a recipe by shipped name or file path."""
    path = resolve_recipe_path(name_or_path)
    data, problems = apply_overrides(read_recipe_data(path), overrides)
    return validate(data, str(path), name=path.stem, registry=registry, problems=problems)


# --- writing --------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string (escapes included)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML for recipe data: top-level scalars, then one table per section."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for section, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{section}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines).lstrip("\n") + "\n"

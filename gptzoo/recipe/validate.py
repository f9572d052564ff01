"""Validation: resolved recipe data -> a frozen Recipe, or a RecipeError listing every problem with
its key path. The one part of recipe handling that consults the registry (component names, their
parameters against the factory's signature, and each factory's optional ``check``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from gptzoo.errors import RecipeError, UnknownComponentError, did_you_mean
from gptzoo.hookspecs import CONTRACTS
from gptzoo.recipe.schema import (
    COMPONENT_KEYS,
    MAX_DIM,
    NORM_PLACEMENTS,
    ON_NONFINITE,
    PARALLELISMS,
    PRECISIONS,
    SECTIONS,
    TOP_LEVEL_KEYS,
    Component,
    GenerateSpec,
    ModelSpec,
    Recipe,
    TrainSpec,
)
from gptzoo.registry import Registry, default_registry

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
                f'{where} must be a component name or a table {{ name = "...", ... }}, got {_describe(value)}'
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
        for key, low in (
            *((k, 1) for k in ("vocab_size", "context_length", "n_layer", "n_head", "n_embd", "d_ff")),
            ("n_kv_head", 0),
            ("head_dim", 0),
        ):
            if key in values and not low <= values[key] <= MAX_DIM:
                default = " (or 0 for the default)" if low == 0 else ""
                self.problems.append(
                    f"[model] {key}={values[key]} must be between {max(low, 1)} and {MAX_DIM}{default}"
                )
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
        given_by_model = CONTRACTS[kind].given_by_model
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
                self.problems.append(
                    f"[generate] unknown key {key!r}{did_you_mean(key, ['samplers', 'max_new_tokens', 'stop'])}"
                )
        samplers, stop = data.get("samplers", []), data.get("stop", [])
        max_new_tokens = data.get("max_new_tokens", 128)
        if not isinstance(samplers, list):
            self.problems.append(
                f"[generate] samplers must be a list of sampler names or tables, got {_describe(samplers)}"
            )
            samplers = []
        steps = [
            self.component("generate", f"samplers[{i}]", value, kind="sampler") for i, value in enumerate(samplers)
        ]
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
                    self.problems.append(
                        f"[generate] samplers[{i}] ({step.name}) chooses the token, so it must come last"
                    )
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
                self.problems.append(
                    f"[train] {key}={values[key]!r} must be one of {', '.join(map(repr, choices))}{did_you_mean(values[key], list(choices))}"
                )
        context = model.get("context_length") if model else None
        if isinstance(context, int) and values.get("seq_len", 0) > context:
            self.problems.append(
                f"[train] seq_len={values['seq_len']} is above the model's context_length={context}; lower seq_len"
            )
        return TrainSpec(**values) if len(self.problems) == before else None

    def component_checks(self, spec: ModelSpec) -> None:
        """Run each factory's optional ``check`` on the complete model (e.g. rope's even head_dim)."""
        for kind in COMPONENT_KEYS:
            component: Component = getattr(spec, kind)
            check = getattr(self.registry.get(kind, component.name).factory, "check", None)
            if check is not None:
                for problem in check(**structural_args(spec, kind), **component.kwargs):
                    self.problems.append(f"[model] {kind} ({component.name}): {problem}")


def structural_args(spec: ModelSpec, kind: str) -> dict[str, Any]:
    """The arguments the model passes to a factory of this kind, beyond the recipe's parameters
    and the components it takes (gptzoo.hookspecs.CONTRACTS)."""
    return {arg: getattr(spec, attr) for arg, attr in CONTRACTS[kind].structural}


def validate(
    data: dict[str, Any], source: str, *, name: str, registry: Registry | None = None, problems: Iterable[str] = ()
) -> Recipe:
    """A Recipe from resolved data, or a RecipeError listing every problem (after ``problems``
    found earlier, e.g. in overrides)."""
    v = _Validator(registry if registry is not None else default_registry())
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

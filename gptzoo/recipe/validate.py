"""Validation: resolved recipe data -> a frozen Recipe, or a RecipeError listing every problem with
its key path. The one part of recipe handling that consults the registry (component names, bare or
qualified, their parameters against the factory's signature, and each factory's optional ``check``).
Each resolved component holds the entry it resolved to (``Component.entry``, which the builder, the
summary and the export use: :func:`entry_of`) and records its distribution and version
(``Component.origin``); a
``[provenance]`` table read back (a checkpoint's) names the distribution to install for a component
that no installed plugin registers, and picks the recorded distribution's entry of a name that has
become ambiguous since, or whose bare name now means another distribution's component (the
component is then named qualified; a recorded distribution that is missing is a problem that says
what to install, never a silent switch to another implementation). A bare name that means a built-in
while an installed plugin registers it too (shadowed, gptzoo.registry) is a GptzooWarning naming
both and the qualified names, once per registry (gptzoo.registry.Entry.warn): every command that
reads a recipe validates it here (a listing, gptzoo.catalog, matches names without it, and does not warn).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from gptzoo import plugin_code
from gptzoo.defaults import TOKENIZER_NAMES, TRAIN_PRECISIONS
from gptzoo.errors import (
    AmbiguousComponentError,
    ComponentLookupError,
    PluginError,
    RecipeError,
    UnknownComponentError,
    did_you_mean,
    exception_text,
)
from gptzoo.hookspecs import CONTRACTS
from gptzoo.plugin_manager import canonical_name
from gptzoo.recipe.schema import (
    BARE_KEY,
    COMPONENT_KEYS,
    LAYER_TYPES,
    MAX_DIM,
    MAX_HEADS,
    MAX_INIT_STD,
    MAX_INT,
    MAX_LAYERS,
    MAX_TENSOR,
    MULTIPLIERS,
    NORM_PLACEMENTS,
    ON_NONFINITE,
    ORIGIN,
    PARALLELISMS,
    PROVENANCE,
    SAMPLERS,
    SECTIONS,
    TOP_LEVEL_KEYS,
    Component,
    GenerateSpec,
    LayerType,
    ModelSpec,
    Recipe,
    TrainSpec,
    describe,
    merge_component,
    show,
)
from gptzoo.registry import NAME, Entry, Registry, default_registry, split_name

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
MAX_DEPTH = 32
"""The deepest nesting of tables and arrays a recipe may have (a component parameter's value included)."""
ORIGIN_TEXT = '"DISTRIBUTION VERSION" (e.g. "gptzoo 0.1.0")'


def _type_ok(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def key_text(key: str) -> str:
    """A key as a key path writes it: bare when it is a TOML bare key, else quoted (one line, always)."""
    return key if BARE_KEY.fullmatch(key) else show(key)


def _where(path: tuple[str | int, ...]) -> str:
    """'description', '[model] norm.name', '[generate] samplers[0]': the place of a value."""
    if len(path) == 1:
        return key_text(str(path[0]))
    rest = "".join(f"[{p}]" if isinstance(p, int) else f".{key_text(p)}" for p in path[1:])
    return f"[{key_text(str(path[0]))}] {rest.removeprefix('.')}"


def _not_unicode(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8 (a lone surrogate, e.g. from bytes that were not UTF-8), or None."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            return f"is not valid Unicode text (a lone surrogate {ch!r} at index {i}); write it as UTF-8"
    return None


def text_problems(data: dict[str, Any]) -> list[str]:
    """Keys that are not strings, text that is not valid Unicode (it could never be written to a
    checkpoint's recipe.toml and read back) and nesting deeper than MAX_DEPTH, with their key paths."""
    problems = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            reason = _not_unicode(value)
            if reason:
                problems.append(f"{_where(path)}: {show(value)} {reason}")
        elif isinstance(value, (dict, list)) and len(path) > MAX_DEPTH:
            problems.append(f"{_where(path)}: nested more than {MAX_DEPTH} tables or arrays deep")
        elif isinstance(value, dict):
            prefix = f"[{key_text(str(path[0]))}] " if len(path) == 1 else f"{_where(path)}: " if path else ""
            for key, item in reversed(value.items()):
                reason = _not_unicode(key) if isinstance(key, str) else "must be a string"
                if reason:
                    problems.append(f"{prefix}key {show(key)} {reason}")
                else:
                    stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in reversed(list(enumerate(value))))
    return problems


def _value_problem(value: Any, expected: type | None) -> str | None:
    """Why a component parameter's value is not a plain recipe value, given the type of its default
    (None: untyped): floats finite, integers within int64 (or a float's range where a float is
    expected), and nothing but text, numbers, booleans, and arrays and tables of those."""
    if isinstance(value, (bool, str)):
        return None
    if isinstance(value, int) and expected is float:
        return None if _float(value) is not None else f"must be a finite number, got {show(value)}"
    if isinstance(value, int):
        return None if -MAX_INT - 1 <= value <= MAX_INT else f"must be an integer within int64, got {show(value)}"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"must be a finite number, got {show(value)}"
    if isinstance(value, (list, dict)):
        items = value.values() if isinstance(value, dict) else value
        return next(filter(None, (_value_problem(v, None) for v in items)), None)
    return f"must be text, a finite number, true or false, or an array or table of those, got {describe(value)}"


def _quote_hint(section: str, key: str, value: Any) -> str:
    """For a number or boolean written as it would be a component name (``--set model.norm=inf``,
    which TOML reads as a float), how to write that name as text; else ``""``."""
    if not isinstance(value, (bool, int, float)):
        return ""
    text = str(value).lower() if isinstance(value, bool) else show(value)
    if not NAME.fullmatch(text):  # -3, -inf: no component is named so
        return ""
    example = f"""{section}.{key}='"{text}"'""" if section == "model" else f'"{text}"'
    return f"; write a name that reads as a number or boolean in quotes: {example}"


def _float(value: int | float) -> float | None:
    """``value`` as a finite float, or None."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class _Validator:
    """Collects every problem of one recipe."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.problems: list[str] = []
        self.origins: dict[str, str] = {}
        """[provenance]: [model] key -> the ``DISTRIBUTION VERSION`` its component came from."""
        self.sampler_origins: list[str] = []
        self.schedule_refused = False
        self.layer_origins: dict[str, dict[str, str]] = {}
        """[provenance] layer_types: layer type -> [model] key -> ``DISTRIBUTION VERSION``."""

    def provenance(self, data: Any) -> None:
        """Read a [provenance] table (untrusted: a checkpoint's) into ``origins``; refuse a malformed one."""
        if not isinstance(data, dict):
            self.problems.append(f"[{PROVENANCE}] must be a table, got {describe(data)}")
            return
        keys = [*COMPONENT_KEYS, SAMPLERS, LAYER_TYPES]
        for key, value in data.items():
            if key not in keys:
                self.problems.append(f"[{PROVENANCE}] unknown key {show(key)}{did_you_mean(key, keys)}")
            elif key == LAYER_TYPES:
                self.layer_provenance(value)
            elif key != SAMPLERS:
                if isinstance(value, str) and ORIGIN.fullmatch(value):
                    self.origins[key] = value
                else:
                    self.problems.append(f"[{PROVENANCE}] {key} must be {ORIGIN_TEXT}, got {describe(value)}")
            elif isinstance(value, list) and all(isinstance(v, str) and ORIGIN.fullmatch(v) for v in value):
                self.sampler_origins = value
            else:
                self.problems.append(f"[{PROVENANCE}] {key} must be a list of {ORIGIN_TEXT}, got {describe(value)}")

    def layer_provenance(self, data: Any) -> None:
        """[provenance] layer_types: { TYPE = { KEY = "DISTRIBUTION VERSION" } }."""
        ok = isinstance(data, dict) and all(
            isinstance(name, str)
            and BARE_KEY.fullmatch(name)
            and isinstance(origins, dict)
            and all(k in COMPONENT_KEYS and isinstance(v, str) and ORIGIN.fullmatch(v) for k, v in origins.items())
            for name, origins in data.items()
        )
        if not ok:
            self.problems.append(
                f"[{PROVENANCE}] {LAYER_TYPES} must be a table of layer types, each a table of components' "
                f"{ORIGIN_TEXT}, got {describe(data)}"
            )
            return
        self.layer_origins = data

    def missing(self, kind: str, name: str, origin: str, *, instead: Entry | None = None) -> str:
        """Why a component the recipe's [provenance] says came from ``origin`` is not registered, and
        what to install; ``instead``: the entry of another distribution that its bare name reaches now,
        which is never used in its place."""
        dist, version = origin.split(" ")
        if instead is not None:
            origin = (
                f"{origin} (not the {kind} of that name from {instead.provenance.origin}, a different implementation)"
            )
        failed = self.registry.failed_distribution(dist)
        if failed is not None:
            return (
                f"{kind} {name!r} came from {origin}, which is installed but failed to load: {failed.error}; fix or "
                "reinstall it (see `gptzoo plugins`)"
            )
        loaded = self.registry.loaded_distribution(dist)
        if loaded is not None:
            return (
                f"{kind} {name!r} came from {origin}, and the installed {loaded.distribution} {loaded.version} does "
                f"not register it: pip install '{dist}=={version}'"
            )
        return f"{kind} {name!r} came from {origin}, which is not installed: pip install {dist}"

    def section(self, name: str, cls: type, data: Any) -> dict[str, Any] | None:
        if not isinstance(data, dict):
            self.problems.append(f"[{name}] must be a table, got {describe(data)}")
            return None
        hints = get_type_hints(cls)
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key in data:
            if key not in known:
                self.problems.append(f"[{name}] unknown key {show(key)}{did_you_mean(key, list(known))}")
        for key, f in known.items():
            if key not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    self.problems.append(f"[{name}] {key} is missing")
                continue
            expected = hints[key]
            value = data[key]
            if cls is ModelSpec and key in LAYER_KEYS:
                layers = LAYER_KEYS[key](self, value, data)
                if layers is not None:
                    values[key] = layers
            elif expected is Component:
                component = self.component(name, key, value, origin=self.origins.get(key))
                if component is not None:
                    values[key] = component
            elif not _type_ok(value, expected):
                self.problems.append(f"[{name}] {key} must be {_TYPE_NAMES[expected]}, got {describe(value)}")
            elif expected is float and isinstance(value, int) and _float(value) is None:
                self.problems.append(f"[{name}] {key}={show(value)} must be a finite number")
            else:
                values[key] = float(value) if expected is float else value
        return values

    def component(
        self, section: str, key: str, value: Any, *, kind: str | None = None, origin: str | None = None
    ) -> Component | None:
        """The component a recipe value names, or None (its problems recorded); ``origin``: where
        [provenance] says it came from."""
        where = f"[{section}] {key}"
        kind = kind or key
        if isinstance(value, str):
            name, params = value, {}
        elif isinstance(value, dict) and isinstance(value.get("name"), str):
            params = {k: v for k, v in value.items() if k != "name"}
            name = value["name"]
        else:
            self.problems.append(
                f'{where} must be a component name or a table {{ name = "...", ... }}, got {describe(value)}'
                f"{_quote_hint(section, key, value)}"
            )
            return None
        try:
            entry = self.registry.get(kind, name)
        except AmbiguousComponentError as exc:
            recorded = origin.split(" ")[0] if origin is not None else None
            if recorded is None or all(canonical_name(d) != canonical_name(recorded) for d, _ in exc.origins):
                self.problems.append(f"{where}: {exc}")
                return None
            name = f"{recorded}:{name}"  # the recorded distribution says which one it was
            entry = self.registry.get(kind, name)
        except ComponentLookupError as exc:
            dist = split_name(name)[0]
            stale = origin is None or (
                dist is not None and canonical_name(dist) != canonical_name(origin.split(" ")[0])
            )
            known = isinstance(exc, UnknownComponentError) and not stale
            self.problems.append(f"{where}: {self.missing(kind, name, origin) if known else exc}")
            return None
        if split_name(name)[0] is None and origin is not None:
            recorded = origin.split(" ")[0]
            if canonical_name(recorded) != canonical_name(entry.provenance.distribution):
                try:  # [provenance] decides: the bare name now means another implementation
                    entry = self.registry.get(kind, f"{recorded}:{name}")
                except UnknownComponentError:
                    self.problems.append(f"{where}: {self.missing(kind, name, origin, instead=entry)}")
                    return None
                name = f"{recorded}:{name}"
        elif split_name(name)[0] is None and (theirs := self.registry.shadowing(entry)):
            entry.warn(shadowed(where, entry, theirs))
        before = len(self.problems)
        self.component_params(where, entry, params)
        if len(self.problems) > before:
            return None
        return Component(name, tuple(params.items()), origin=entry.provenance.origin, entry=entry)

    def layer_pattern(self, value: Any, _model: dict[str, Any]) -> tuple[str, ...] | None:
        if isinstance(value, list) and len(value) > MAX_LAYERS:
            self.problems.append(
                f"[model] layer_pattern has {len(value)} entries, more than the {MAX_LAYERS} layers a model may have"
            )
            self.schedule_refused = True
            return None
        if isinstance(value, list) and all(isinstance(v, str) and BARE_KEY.fullmatch(v) for v in value):
            return tuple(value)
        self.problems.append(
            "[model] layer_pattern must be a list of layer type names (letters, digits, _ and -), e.g. "
            f'["sliding", "full"], got {describe(value)}'
        )
        self.schedule_refused = True
        return None

    def layer_types(self, value: Any, model: dict[str, Any]) -> tuple[tuple[str, LayerType], ...] | None:
        """Each layer type's components; a table without a name changes [model]'s component (``model``: the
        [model] data) as a child recipe does."""
        if not isinstance(value, dict):
            self.problems.append(
                f"[model] {LAYER_TYPES} must be a table of layer types (e.g. [model.{LAYER_TYPES}.sliding]), "
                f"got {describe(value)}"
            )
            self.schedule_refused = True
            return None
        before = len(self.problems)
        types = []
        for name, table in value.items():
            where = f"{LAYER_TYPES}.{key_text(name)}"
            if not BARE_KEY.fullmatch(name):
                self.problems.append(f"[model] {where}: a layer type's name has only letters, digits, _ and -")
                continue
            if not isinstance(table, dict):
                self.problems.append(
                    f"[model] {where} must be a table of the components it changes ({', '.join(COMPONENT_KEYS)}), "
                    f"got {describe(table)}"
                )
                continue
            components: dict[str, Any] = {}
            for key, item in table.items():
                if key == "norm_placement":
                    if item in NORM_PLACEMENTS:
                        components[key] = item
                    else:
                        self.problems.append(
                            f"[model] {where}.norm_placement={show(item)} must be one of "
                            f"{', '.join(map(repr, NORM_PLACEMENTS))}"
                        )
                    continue
                if key not in COMPONENT_KEYS:
                    keys = [*COMPONENT_KEYS, "norm_placement"]
                    self.problems.append(
                        f"[model] {where}: unknown key {show(key)}{did_you_mean(key, keys)} (a layer type changes "
                        "components and norm_placement only)"
                    )
                    continue
                origin = self.layer_origins.get(name, {}).get(key)
                item = merge_component(model.get(key), item)
                component = self.component("model", f"{where}.{key}", item, kind=key, origin=origin)
                if component is not None:
                    components[key] = component
            types.append((name, LayerType(**components)))
        if len(self.problems) > before:
            self.schedule_refused = True
            return None
        return tuple(types)

    def schedule(self, values: dict[str, Any]) -> None:
        """The pattern names only defined layer types, and every defined type is in it (unless the pattern or
        the layer types had problems of their own, already reported)."""
        if self.schedule_refused:
            return
        pattern, types = values.get("layer_pattern", ()), dict(values.get("layer_types", ()))
        for name in dict.fromkeys(pattern):
            if name not in types:
                self.problems.append(
                    f"[model] layer_pattern names {show(name)}, which [model.{LAYER_TYPES}] does not define"
                    f"{did_you_mean(name, list(types))}; add [model.{LAYER_TYPES}.{name}] (empty: [model]'s components)"
                )
        for name in types:
            if name not in pattern:
                self.problems.append(
                    f"[model] {LAYER_TYPES}.{name} is not used by layer_pattern; add it to the pattern or remove it"
                )
        own = {name: t.norm_placement for name, t in types.items() if t.norm_placement}
        placements = {own.get(name, values.get("norm_placement", "pre")) for name in pattern} if pattern else set()
        if "post" in placements and len(placements) > 1:
            named = ", ".join(f"{LAYER_TYPES}.{n}.norm_placement={show(p)}" for n, p in own.items())
            self.problems.append(
                f"[model] {named} mixes Post-LN layers with others: a Post-LN model ends on a normalized layer and has "
                "no final norm, which the others need; give every layer type the same norm_placement"
            )

    def model(self, values: dict[str, Any]) -> ModelSpec | None:
        """Check dimensions; with a complete, consistent [model], check component parameters."""
        before = len(self.problems)
        for key, low in (
            *((k, 1) for k in ("vocab_size", "context_length", "n_layer", "n_head", "n_embd", "d_ff")),
            ("n_kv_head", 0),
            ("head_dim", 0),
        ):
            high = {"n_layer": MAX_LAYERS, "n_head": MAX_HEADS, "n_kv_head": MAX_HEADS}.get(key, MAX_DIM)
            if key in values and not low <= values[key] <= high:
                default = " (or 0 for the default)" if low == 0 else ""
                self.problems.append(
                    f"[model] {key}={show(values[key])} must be between {max(low, 1)} and {high}{default}"
                )
                del values[key]
        if "init_std" in values and not 0 < values["init_std"] <= MAX_INIT_STD:
            self.problems.append(
                f"[model] init_std={show(values['init_std'])} must be a number > 0 and at most {MAX_INIT_STD:g}"
            )
        placement = values.get("norm_placement")
        if placement is not None and placement not in NORM_PLACEMENTS:
            self.problems.append(
                f"[model] norm_placement={show(placement)} must be one of {', '.join(map(repr, NORM_PLACEMENTS))}"
            )
        n_embd, n_head = values.get("n_embd"), values.get("n_head")
        if n_embd and n_head and not values.get("head_dim") and n_embd % n_head:
            self.problems.append(
                f"[model] n_embd={n_embd} is not divisible by n_head={n_head} (or set head_dim explicitly)"
            )
        n_kv_head = values.get("n_kv_head")
        if n_head and n_kv_head and n_head % n_kv_head:
            self.problems.append(f"[model] n_head={n_head} is not divisible by n_kv_head={n_kv_head}")
        self.tensor_sizes(values)
        self.schedule(values)
        softcap = values.get("logit_softcap", 0.0)
        if not (math.isfinite(softcap) and softcap >= 0):
            self.problems.append(f"[model] logit_softcap={show(softcap)} must be 0 (off) or a finite number above it")
        for key in MULTIPLIERS:
            factor = values.get(key, 1.0)
            if not (math.isfinite(factor) and factor > 0):
                self.problems.append(f"[model] {key}={show(factor)} must be a finite number above 0 (1: none)")
        if values.get("scale_embeddings") and values.get("embedding_multiplier", 1.0) != 1.0:
            self.problems.append(
                f"[model] scale_embeddings=true and embedding_multiplier={show(values['embedding_multiplier'])} both "
                "scale the embeddings; give one (scale_embeddings multiplies by sqrt(n_embd))"
            )
        required = {f.name for f in fields(ModelSpec) if f.default is MISSING}
        if len(self.problems) > before or not required <= values.keys():
            return None
        spec = ModelSpec(**values)
        self.component_checks(spec)
        return spec

    def tensor_sizes(self, values: dict[str, Any]) -> None:
        """Products of dimensions that size one tensor: each within MAX_TENSOR elements."""
        n_embd, n_head = values.get("n_embd"), values.get("n_head")
        head_dim = values.get("head_dim") or (n_embd // n_head if n_embd and n_head else None)
        for names in (
            ("vocab_size", "n_embd"),
            ("context_length", "n_embd"),
            ("n_embd", "d_ff"),
            ("n_embd", "n_head", "head_dim"),
        ):
            dims = [head_dim if name == "head_dim" else values.get(name) for name in names]
            if all(dims) and math.prod(dims) > MAX_TENSOR:
                self.problems.append(
                    f"[model] {' x '.join(names)} = {' x '.join(map(str, dims))} = {math.prod(dims):.3g} elements in "
                    f"one tensor, more than the 2**40 gptzoo builds; make them smaller"
                )

    def component_params(self, where: str, entry: Entry, params: dict[str, Any]) -> None:
        """Check the recipe's parameters against the factory's signature and the defaults' types. A
        factory taking ``**kwargs`` accepts any other parameter, untyped."""
        signature = plugin_code.signature(entry)
        if signature is None:  # a builtin without a signature: the factory will judge
            return
        with plugin_code.running(entry, "has a signature that cannot be read"):
            wrong = plugin_code.signature_problem(entry, signature)
        if wrong is not None:
            raise PluginError(wrong)
        kind, note = entry.kind, plugin_code.overridden(entry)
        given_by_model = CONTRACTS[kind].given_by_model
        with plugin_code.running(entry, "has a signature that cannot be read"):
            accepted = {
                str.__str__(p.name): p.default
                for p in signature.parameters.values()
                if p.name not in given_by_model and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            }
            any_keyword = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
        for param, value in params.items():
            if param in given_by_model or (param not in accepted and not any_keyword):
                hint = did_you_mean(param, list(accepted)) if accepted else " (it takes none)"
                if param in given_by_model:
                    hint = f"; the model passes it: set [model] {dict(CONTRACTS[kind].structural).get(param, param)}"
                self.problems.append(
                    f"{where}.{key_text(param)}: {kind} {show(entry.name)} has no parameter {show(param)}{hint}{note}"
                )
                continue
            default = accepted.get(param)  # None: taken by **kwargs, untyped
            with plugin_code.running(entry, f"has a parameter {show(param)} whose default cannot be inspected"):
                expected = None if default is inspect.Parameter.empty or default is None else type(default)
                ok = expected is None or _type_ok(value, expected)
                must_be = None if ok else f"{_TYPE_NAMES.get(expected, expected.__name__)}"
            if must_be is not None:
                self.problems.append(f"{where}.{param} must be {must_be}, got {describe(value)}{note}")
            elif problem := _value_problem(value, expected):
                self.problems.append(f"{where}.{param} {problem}{note}")
            elif expected is float:
                params[param] = float(value)

    def generate(self, data: Any) -> GenerateSpec | None:
        if not isinstance(data, dict):
            self.problems.append(f"[generate] must be a table, got {describe(data)}")
            return None
        before = len(self.problems)
        for key in data:
            if key not in ("samplers", "max_new_tokens", "stop"):
                self.problems.append(
                    f"[generate] unknown key {show(key)}{did_you_mean(key, ['samplers', 'max_new_tokens', 'stop'])}"
                )
        samplers, stop = data.get("samplers", []), data.get("stop", [])
        max_new_tokens = data.get("max_new_tokens", 128)
        if not isinstance(samplers, list):
            self.problems.append(
                f"[generate] samplers must be a list of sampler names or tables, got {describe(samplers)}"
            )
            samplers = []
        origins = self.sampler_origins if len(self.sampler_origins) == len(samplers) else []
        steps = [
            self.component("generate", f"samplers[{i}]", value, kind="sampler", origin=origins[i] if origins else None)
            for i, value in enumerate(samplers)
        ]
        if not _type_ok(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_DIM:
            self.problems.append(
                f"[generate] max_new_tokens must be an integer between 1 and {MAX_DIM}, got {describe(max_new_tokens)}"
            )
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            self.problems.append(f"[generate] stop must be a list of non-empty strings, got {describe(stop)}")
        for i, step in enumerate(steps):
            if step is not None:
                self.sampler(i, step, last=i == len(steps) - 1)
        if len(self.problems) > before:
            return None
        return GenerateSpec(tuple(s for s in steps if s is not None), max_new_tokens, tuple(stop))

    def sampler(self, i: int, step: Component, *, last: bool) -> None:
        """Run the sampler's check, then build it (samplers are cheap) to let it judge its parameter
        values (ValueError, as the contract says) and hold it to its contract."""
        entry = entry_of("sampler", step, self.registry)
        where, note = f"[generate] samplers[{i}] ({step.name})", plugin_code.overridden(entry)
        problems = plugin_code.check(entry, step.kwargs)
        self.problems.extend(f"{where}: {problem}{note}" for problem in problems)
        if problems:
            return
        try:
            sampler = plugin_code.build(entry, step.kwargs, user_errors=(TypeError, ValueError))
        except (TypeError, ValueError) as exc:
            self.problems.append(f"{where}: {exception_text(exc)}{note}")
            return
        plugin_code.check_contract(entry, sampler)
        if sampler.picks and not last:
            self.problems.append(f"{where} chooses the token, so it must come last")

    def train(self, values: dict[str, Any], model: dict[str, Any] | None) -> TrainSpec | None:
        """Ranges and choices of [train]; seq_len against the model's context."""
        before = len(self.problems)
        for keys, low, bound in (
            (
                ("max_steps", "micro_batch_size", "grad_accum", "eval_batches", "keep_checkpoints", "log_every"),
                1,
                "at least 1",
            ),
            (("seq_len", "warmup_steps", "eval_every", "checkpoint_every", "seed"), 0, "0 or more"),
        ):
            for key in (k for k in keys if k in values):
                if not low <= values[key] <= MAX_INT:
                    limit = f"must be {bound}" if values[key] < low else f"must be at most {MAX_INT}"
                    self.problems.append(f"[train] {key}={show(values[key])} {limit}")
        for key in ("lr", "min_lr", "weight_decay", "grad_clip", "peak_tflops", "aux_loss_weight"):
            if key in values and not (values[key] >= 0 and math.isfinite(values[key])):
                self.problems.append(f"[train] {key}={values[key]} must be a finite number >= 0")
        if "eps" in values and not (values["eps"] > 0 and math.isfinite(values["eps"])):
            self.problems.append(f"[train] eps={values['eps']} must be a finite number > 0 (AdamW divides by it)")
        for key in ("beta1", "beta2"):
            if key in values and not 0 <= values[key] < 1:
                self.problems.append(f"[train] {key}={values[key]} must be in [0, 1)")
        lr, min_lr = values.get("lr", TrainSpec.lr), values.get("min_lr", TrainSpec.min_lr)
        if all(math.isfinite(x) and x >= 0 for x in (lr, min_lr)) and min_lr > lr:
            self.problems.append(f"[train] min_lr={min_lr} is above lr={lr}")
        for key, choices in (
            ("precision", TRAIN_PRECISIONS),
            ("on_nonfinite", ON_NONFINITE),
            ("parallel", PARALLELISMS),
        ):
            if key in values and values[key] not in choices:
                hint = did_you_mean(values[key], list(choices))
                self.problems.append(
                    f"[train] {key}={show(values[key])} must be one of {', '.join(map(repr, choices))}{hint}"
                )
        if "\0" in values.get("data", ""):
            self.problems.append(f"[train] data must be a directory path, without NUL, got {show(values['data'])}")
        context = model.get("context_length") if model else None
        if _type_ok(context, int) and 1 <= context <= MAX_DIM and values.get("seq_len", 0) > context:
            self.problems.append(
                f"[train] seq_len={values['seq_len']} is above the model's context_length={context}; lower seq_len"
            )
        return TrainSpec(**values) if len(self.problems) == before else None

    def tokenizer(self, values: dict[str, Any]) -> bool:
        """Whether [tokenizer] name is one gptzoo.tokenizer knows."""
        name = values["name"]
        if name not in TOKENIZER_NAMES:
            self.problems.append(
                f"[tokenizer] name: unknown tokenizer {show(name)}{did_you_mean(name, TOKENIZER_NAMES)}"
            )
        return name in TOKENIZER_NAMES

    def weights(self, values: dict[str, Any]) -> bool:
        """Whether [weights] hf can name a checkpoint (a directory or a hub name)."""
        problem = "must not be empty" if not values["hf"] else "must not contain NUL" if "\0" in values["hf"] else ""
        if problem:
            self.problems.append(f"[weights] hf {problem}, got {show(values['hf'])}")
        return not problem

    def component_checks(self, spec: ModelSpec) -> None:
        """Run each factory's optional ``check`` on the complete model (e.g. rope's even head_dim)."""
        for kind in COMPONENT_KEYS:
            self.component_check(spec, kind, kind, getattr(spec, kind))
        for name, layer in spec.layer_types:
            for kind, component in layer.overrides().items():
                self.component_check(spec, f"{LAYER_TYPES}.{name}.{kind}", kind, component)

    def component_check(self, spec: ModelSpec, where: str, kind: str, component: Component) -> None:
        entry = entry_of(kind, component, self.registry)
        for problem in plugin_code.check(entry, {**structural_args(spec, kind), **component.kwargs}):
            self.problems.append(f"[model] {where} ({component.name}): {problem}{plugin_code.overridden(entry)}")


LAYER_KEYS = {"layer_pattern": _Validator.layer_pattern, LAYER_TYPES: _Validator.layer_types}
"""[model] keys read by a method of their own rather than by their type."""


def structural_args(spec: ModelSpec, kind: str) -> dict[str, Any]:
    """The arguments the model passes to a factory of this kind, beyond the recipe's parameters
    and the components it takes (gptzoo.hookspecs.CONTRACTS)."""
    return {arg: getattr(spec, attr) for arg, attr in CONTRACTS[kind].structural}


def entry_of(kind: str, component: Component, registry: Registry) -> Entry:
    """The entry of ``component`` in ``registry``: the one validation resolved it to, when it was
    validated against this registry; else its name looked up here, once (a Component made by hand, or
    one validated against another registry: the registry a model is built with decides, as a
    recipe's components are those of the plugins it is built with)."""
    entry = component.entry
    if entry is not None and registry.holds(entry):
        return entry
    return registry.get(kind, component.name)


def resolve_components(recipe: Recipe, registry: Registry) -> dict[str, tuple[Entry, Component]]:
    """The registry entry and recipe value of each component of the recipe, by [model] key (= kind),
    then those of each layer type, by ``layer_types.TYPE.KEY``."""
    spec = recipe.model
    components = {kind: getattr(spec, kind) for kind in COMPONENT_KEYS}
    for name, layer in spec.layer_types:
        components.update({f"{LAYER_TYPES}.{name}.{kind}": c for kind, c in layer.overrides().items()})
    return {key: (entry_of(key.rsplit(".", 1)[-1], c, registry), c) for key, c in components.items()}


def shadowed(where: str, entry: Entry, theirs: list[Entry]) -> str:
    """The warning about a bare name that means the built-in ``entry`` while plugins register it too."""
    who = ", ".join(e.provenance.origin for e in theirs)
    write = " or ".join(repr(e.qualified_name) for e in theirs)
    return (
        f"{where}: {entry.kind} {entry.name!r} is the built-in one ({entry.provenance.origin}), and {who} "
        f"register{'s' if len(theirs) == 1 else ''} {entry.kind} {entry.name!r} too; write {write} for the "
        f"plugin's, or {entry.qualified_name!r} for the built-in without this warning"
    )


def step_problems(where: str, entry: Entry, params: dict[str, Any], registry: Registry) -> list[str]:
    """The problems of a sampler step given on the command line (``--sampler NAME:k=v``), found as
    a recipe's [generate] samplers' are (parameters against the factory's signature and the
    defaults' types); an integer given for a float parameter becomes a float in ``params``."""
    v = _Validator(registry)
    v.component_params(where, entry, params)
    return v.problems


def validate(
    data: dict[str, Any],
    source: str,
    *,
    name: str,
    registry: Registry | None = None,
    problems: Iterable[str] = (),
) -> Recipe:
    """A Recipe from resolved data, or a RecipeError listing every problem (after ``problems``
    found earlier, e.g. in overrides). Data whose keys or text are not valid Unicode strings, or
    that nests too deeply, is refused with those problems alone."""
    v = _Validator(registry if registry is not None else default_registry())
    v.problems.extend(problems)
    if not isinstance(data, dict):
        raise RecipeError(source, [*v.problems, f"a recipe must be a table of sections, got {describe(data)}"])
    if unreadable := text_problems(data):
        raise RecipeError(source, [*v.problems, *unreadable])
    known = [*SECTIONS, PROVENANCE, *TOP_LEVEL_KEYS]
    for key in data:
        if key not in known:
            v.problems.append(f"unknown section or key {show(key)}{did_you_mean(key, known)}")
    if PROVENANCE in data:
        v.provenance(data[PROVENANCE])
    if "extends" in data:
        v.problems.append(f"extends = {show(data['extends'])} is followed when a recipe file is read, not here")
    description = data.get("description", "")
    if not isinstance(description, str):
        v.problems.append(f"description must be a string, got {describe(description)}")
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
    for key, check in (("tokenizer", v.tokenizer), ("weights", v.weights)):
        if key in data:
            values = v.section(key, SECTIONS[key], data[key])
            if values is not None and len(values) == len(fields(SECTIONS[key])) and check(values):
                optional[key] = SECTIONS[key](**values)
    model = v.model(model_values) if model_values is not None else None
    if v.problems or model is None:
        raise RecipeError(source, v.problems)
    return Recipe(name=name, source=source, model=model, description=description, **optional)

"""What a Hugging Face architecture ("family") is to gptzoo: how its config.json maps to a recipe,
and where each component's tensors live in its checkpoints.

A family owns the skeleton of a checkpoint (``transformer.h.3.attn.`` is GPT-2's layer 3
attention) and its structural config.json fields (sizes, layer count); the tensors inside each
part, and the config.json fields a component owns (a norm's epsilon, the activation's name, rope's
theta), are given by the component class's layout (gptzoo.hf.layouts: the built-ins' are written in
the module of the family that names the layout, a plugin registers its own). A component without an
equivalent in a family has no layout there, or one that refuses its parameters, and export refuses
the recipe naming it. Import maps config.json to the family's own components
(:meth:`Family.recipe_data`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from gptzoo import plugin_code
from gptzoo.class_table import Row
from gptzoo.errors import CheckpointError, GptzooError, PluginError, did_you_mean
from gptzoo.hf.layouts import Layouts
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe
from gptzoo.recipe.schema import MULTIPLIERS
from gptzoo.registry import Entry, Registry, default_registry, show_plain
from gptzoo.untrusted import WEIGHT_DTYPES_TEXT


class NoEquivalentError(GptzooError):
    """A recipe that a Hugging Face architecture cannot express; ``reasons`` lists why (one each)."""

    def __init__(self, message: str, reasons: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.reasons = list(reasons) or [message]


@dataclass(frozen=True)
class Part:
    """A module of ours and the key prefixes of its tensors on both sides."""

    module: nn.Module
    ours: str
    theirs: str
    maps: list[TensorMap] | None = None
    """Explicit maps (for plain torch modules such as the embedding); None asks the module's layout."""


@dataclass(frozen=True)
class Size:
    """One of a family's sizes: the recipe's model field and config.json's, read and written by the one
    table (:attr:`Family.sizes`, :meth:`Family.read_sizes`, :meth:`Family.write_sizes`)."""

    ours: str
    theirs: str
    default: int | float | bool | Callable[[Mapping[str, Any], Mapping[str, Any]], Any] | None = None
    """The value of an absent field (its type says how the field is read: a bool is a flag, a float a number,
    else a positive integer), or ``default(read, config)`` of the sizes read before it and config.json;
    None: the field is required."""


SIZES: tuple[Size, ...] = (
    Size("vocab_size", "vocab_size"),
    Size("n_embd", "hidden_size"),
    Size("n_head", "num_attention_heads"),
    Size("n_layer", "num_hidden_layers"),
    Size("n_kv_head", "num_key_value_heads", lambda read, config: read["n_head"]),
    Size("d_ff", "intermediate_size"),
    Size("context_length", "max_position_embeddings", 2048),
    Size("tie_embeddings", "tie_word_embeddings", False),
    Size("init_std", "initializer_range", 0.02),
)
"""The sizes of Llama and the families shaped like it, in the order they are read."""


def read_sizes(f: Fields, sizes: Sequence[Size], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's model fields of ``sizes``, read from config.json (``defaults``: ours -> a family's own
    default, in place of the table's)."""
    read: dict[str, Any] = {}
    for size in sizes:
        default = defaults.get(size.ours, size.default)
        if callable(default):
            default = default(read, f.config)
        if isinstance(default, bool):
            read[size.ours] = f.flag(size.theirs, default)
        elif isinstance(default, float):
            read[size.ours] = f.number(size.theirs, default)
        else:
            read[size.ours] = f.integer(size.theirs, default)
    return read


def write_sizes(recipe: Recipe, sizes: Sequence[Size]) -> dict[str, Any]:
    """config.json's fields of ``sizes``, from the recipe."""
    return {size.theirs: getattr(recipe.model, size.ours) for size in sizes}


class Family:
    """Base class of the Hugging Face architectures gptzoo reads and writes."""

    name: str
    """The family's key ("gpt2", "llama", "gemma3")."""
    model_type: str
    """config.json ``model_type``."""
    architecture: str
    """config.json ``architectures[0]`` and the transformers class."""
    embedding: str
    """Their key of the token embedding."""
    head: str = "lm_head.weight"
    """Their key of the LM head (GPT-NeoX: embed_out.weight)."""
    ignored_tensors: tuple[str, ...] = ()
    """Suffixes of non-weight tensors some files carry (masks, rotary tables); dropped on import."""
    title: str
    """How messages name it ("GPT-2", "Llama")."""
    required: dict[str, str] = {}
    """config.json fields that components own and the family needs -> the kind that owns them."""
    layout: str
    """How the family names and lays out each component's tensors and config fields ("gpt2", "llama"):
    the key of components' layouts (gptzoo.hf.layouts); families that store their parts as Llama does
    share "llama". Default: the family's name."""
    component_layouts: tuple[Row, ...] = ()
    """The built-in components' layouts for ``layout``, written by the family that names it."""
    extends: Family | None = None
    """A family whose layout this one's extends: a component without a layout of this family's key is
    mapped as that family maps it (Mixtral stores everything as Llama does but its experts)."""
    known: frozenset[str] = frozenset()
    """Fields components may give that the family writes to config.json besides ``required``; a
    component giving any other field (a feature the family has no place for, e.g. a sliding window in
    GPT-2) has no equivalent here."""
    implied: Mapping[str, Any] = {}
    """Fields the architecture implies: components must give exactly these values (a Gemma norm's
    rms_norm_offset = 1), and they are not written to config.json. Once a component of some kind gives
    one, every component of that kind must (a layer type's norm that lacks it computes otherwise)."""
    renames: Mapping[str, str] = {}
    """Component fields the family's config.json names otherwise (Gemma: hidden_act -> hidden_activation)."""
    sizes: tuple[Size, ...] = SIZES
    """Its sizes, recipe field <-> config.json field, read and written by this one table."""
    size_defaults: Mapping[str, Any] = {}
    """The family's own defaults of absent sizes, by the recipe's field (Gemma ties its embeddings)."""
    exports: bool = True
    """Whether export may write this family (a vision-language wrapper whose text part gptzoo reads: no)."""
    per_layer: frozenset[str] = frozenset()
    """Fields that may differ from layer to layer (a sliding window on some layers, each layer type's
    rope theta): collected per layer and handed to :meth:`layer_config` rather than merged."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and getattr(cls, "layout", None) is None:
            cls.layout = cls.name

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Recipe data equivalent to config.json; GptzooError naming any unsupported field."""
        raise NotImplementedError

    def read_sizes(self, f: Fields) -> dict[str, Any]:
        """The recipe's sizes from config.json, by :attr:`sizes`."""
        return read_sizes(f, self.sizes, self.size_defaults)

    def write_sizes(self, recipe: Recipe) -> dict[str, Any]:
        """config.json's sizes from the recipe, by :attr:`sizes`."""
        return write_sizes(recipe, self.sizes)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        """The config.json fields the family writes from the recipe itself (sizes, layer count, ties)."""
        raise NotImplementedError

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        """Why the recipe's structure (norm placement, head layout, biases) has no equivalent here."""
        return []

    def placement_reasons(self, recipe: Recipe) -> list[str]:
        """Why layer types placed otherwise than [model] have no equivalent here: by default every layer of a
        family places its norms alike (a family that differs by layer type overrides this)."""
        m = recipe.model
        return [
            f"layer type {name!r} has norm_placement {layer.norm_placement!r} ({self.title} places every layer's "
            f"norms alike)"
            for name, layer in m.layer_types
            if layer.norm_placement and layer.norm_placement != m.norm_placement
        ]

    multipliers: frozenset[str] = frozenset()
    """The recipe's MULTIPLIERS (embedding_multiplier, residual_multiplier, logits_scaling) the family has fields
    for; any other set to something but 1 has no equivalent here."""

    def multiplier_reasons(self, recipe: Recipe) -> list[str]:
        """Why the recipe's multipliers the family lacks have no equivalent here."""
        return [
            f"{key}={value:g} ({self.title} does not scale by it)"
            for key in MULTIPLIERS
            if key not in self.multipliers and (value := getattr(recipe.model, key)) != 1.0
        ]

    def parts(self, model: GPT) -> list[Part]:
        raise NotImplementedError

    def layouts(self, registry: Registry | None = None) -> Layouts:
        """The components' layouts for this family: the built-ins', then the registry's plugins'."""
        registry = registry if registry is not None else default_registry()
        base = self.extends.layouts(registry) if self.extends is not None else None
        return _layouts(self.layout, self.component_layouts, registry, base)

    def config(
        self,
        recipe: Recipe,
        model: GPT,
        components: Sequence[tuple[Entry, nn.Module]],
        registry: Registry | None = None,
    ) -> dict[str, Any]:
        """config.json fields equivalent to the recipe: the structural ones merged with what each
        component (``components``: every module a factory built for ``model``, a meta-device build of
        the recipe, with its entry) owns; fields in ``per_layer`` are gathered layer by layer (from the
        components of each block and the position encoding it uses) and given to :meth:`layer_config`.
        A module another component's layout maps as its child (an attention's q/k norms) gives no fields of
        its own: that layout describes it.

        Raises:
            NoEquivalentError: naming the structure, each component without an equivalent here (no
                layout, or one whose weights or config gives None), a field the family has no place for,
                components that disagree on a field, and a field the family needs that no component owns.
            PluginError: a component whose layout raises or returns something else.
        """
        layouts = self.layouts(registry)
        reasons = self.structural_reasons(recipe) + self.placement_reasons(recipe) + self.multiplier_reasons(recipe)
        owned: dict[str, tuple[Any, str]] = {}
        structural = self.structure(recipe)
        refused: set[str] = set()
        implied_given: set[str] = set()
        layers_of: dict[int, list[int]] = {}  # id of a module -> the layers it is part of (a position serves many)
        for i, block in enumerate(model.blocks):
            for m in (*block.modules(), *model.positions[model.position_of[i]].modules()):
                layers_of.setdefault(id(m), []).append(i)
        per_layer: dict[str, list[Any]] = {key: [None] * len(model.blocks) for key in self.per_layer}
        given: list[tuple[str, str, set[str]]] = []  # (who, kind, the implied fields it gives)
        mapped = [m for _, module in components for m in layouts.children(module)]
        children = {id(m) for m in mapped}  # their parent's layout describes them (and checks what it must)
        for entry, module in components:
            if id(module) in children:
                continue
            who = f"{entry.kind} {entry.name!r}"
            fields = self._component_fields(entry, module, layouts)
            if isinstance(fields, str):
                if who not in refused:
                    refused.add(who)
                    reasons.append(f"{who} ({fields}: {self.architecture} has no equivalent of it)")
                continue
            given.append((who, entry.kind, {self.renames.get(k, k) for k in fields} & set(self.implied)))
            for key, value in ((self.renames.get(k, k), v) for k, v in fields.items()):
                if key in structural:
                    raise PluginError(
                        f"{plugin_code.culprit(entry)} has a {self.layout!r} layout whose config sets {key}, which "
                        f"{self.architecture} takes from the recipe's structure; {plugin_code.fix(entry)}"
                    )
                if key in self.implied:
                    implied_given.add(key)
                    reason = f"{who} sets {key}={show(value)}, {self.architecture} has {show(self.implied[key])}"
                    if value != self.implied[key] and reason not in reasons:  # once, not once a layer
                        reasons.append(reason)
                    continue
                if key not in self.known and key not in self.required and key not in self.per_layer:
                    reason = f"{who} sets {key}={show(value)}, which {self.architecture} has no field for"
                    if reason not in reasons:
                        reasons.append(reason)
                    continue
                if key in self.per_layer:
                    for i in layers_of.get(id(module), ()):
                        per_layer[key][i] = value
                    continue
                if key in owned and owned[key][0] != value:
                    reason = f"{owned[key][1]} sets {key}={show(owned[key][0])}, {who} sets {key}={show(value)}"
                    if reason not in reasons:
                        reasons.append(reason)
                owned.setdefault(key, (value, who))
        reasons += [
            f"{self.architecture} implies {key}={show(self.implied[key])}, which no component gives"
            for key in self.implied
            if key not in implied_given
        ]
        reasons += self._implied_gaps(given)
        kinds_refused = {who.split(" ", 1)[0] for who in refused}
        reasons += [
            f"config.json needs {key}, which the {kind}'s {self.layout!r} layout gives, and none does"
            for key, kind in self.required.items()
            if key not in owned and key not in self.per_layer and kind not in kinds_refused
        ]
        layered: dict[str, Any] = {}
        if not reasons and self.per_layer:
            layered = self.layer_config(recipe, per_layer, reasons)
        if reasons:
            raise NoEquivalentError(
                f"recipe {recipe.name!r} has no Hugging Face {self.title} equivalent: {'; '.join(reasons)}", reasons
            )
        return {**structural, **{key: value for key, (value, _) in owned.items()}, **layered}

    def _implied_gaps(self, given: Sequence[tuple[str, str, set[str]]]) -> list[str]:
        """Components that lack an implied field other components of their kind give (OLMo 2's norms:
        a layer type's plain rmsnorm beside the float32-scaling ones)."""
        reasons = []
        for key in self.implied:
            kinds = {kind for _, kind, keys in given if key in keys}
            for who, kind, keys in given:
                reason = f"{who} does not set {key}={show(self.implied[key])}, which {self.architecture} implies"
                if kind in kinds and key not in keys and reason not in reasons:
                    reasons.append(reason)
        return reasons

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        """config.json fields from the ``per_layer`` fields of each layer (None where a layer's components
        do not give one); a recipe the family cannot express adds its reason to ``reasons``."""
        raise NotImplementedError

    def _component_fields(self, entry: Entry, module: nn.Module, layouts: Layouts) -> dict[str, Any] | str:
        """The config.json fields one component owns in this family, or why it has no equivalent."""
        key = self.layout
        with plugin_code.running(entry, f"has a broken Hugging Face {key!r} layout (its weights)"):
            maps = layouts.weights(module)
        if isinstance(maps, str):
            return maps
        with plugin_code.running(entry, f"has a broken Hugging Face {key!r} layout (its config)"):
            fields = layouts.config(module)
        if fields is None:
            return f"its {key!r} layout refuses its config"
        plain = (str, int, float, bool, type(None))

        def ok(value: Any) -> bool:  # a plain value, or an object of plain values
            return type(value) in plain or (
                type(value) is dict and all(type(k) is str and type(v) in plain for k, v in value.items())
            )

        if type(fields) is not dict or not all(type(k) is str and ok(v) for k, v in fields.items()):
            raise PluginError(
                f"{plugin_code.culprit(entry)} has a {key!r} layout whose config returned {show_plain(fields)}, not "
                f"a dict of config.json field names to numbers, text, booleans, None or objects of those; "
                f"{plugin_code.fix(entry)}"
            )
        return dict(fields)

    def tensor_map(self, model: GPT, registry: Registry | None = None) -> list[tuple[str, tuple[str, ...], TensorMap]]:
        """(our key, their keys, map) for every tensor of the model's state dict."""
        layouts = self.layouts(registry)
        rows = []
        for part in self.parts(model):
            maps = part.maps if part.maps is not None else layouts.weights(part.module)
            if isinstance(maps, str):
                raise NoEquivalentError(
                    f"{type(part.module).__name__} ({part.ours.rstrip('.')}) has no equivalent in Hugging Face "
                    f"{self.architecture} ({maps})"
                )
            rows += [(part.ours + m.ours, tuple(part.theirs + t for t in m.theirs), m) for m in maps]
        covered = {ours for ours, _, _ in rows}
        expected = set(model.state_dict()) - ({"lm_head.weight"} if model.tied else set())
        if covered != expected:
            raise CheckpointError(
                f"the {self.architecture} weight map does not cover {sorted(expected - covered)} "
                f"(and maps unknown {sorted(covered - expected)}); a component's layout is incomplete"
            )
        return rows

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        """Their tensors (of the checkpoint directory ``source``, dtypes checked) in the layout
        ``parts`` expects: known non-weights dropped, and a tied head stored anyway checked against
        the embedding and dropped."""
        tensors = {k: v for k, v in tensors.items() if not k.endswith(self.ignored_tensors)}
        if model.tied and self.head in tensors:
            head = tensors.pop(self.head)
            embedding = tensors.get(self.embedding)
            if embedding is not None and not head.equal(embedding):
                raise CheckpointError(
                    f"{source}: {self.head} differs from the token embedding {self.embedding}, but config.json "
                    "ties them (tie_word_embeddings); set tie_word_embeddings to false if the head is its own"
                )
        return tensors


@functools.lru_cache(maxsize=16)
def _layouts(layout: str, builtins: tuple[Row, ...], registry: Registry, base: Layouts | None) -> Layouts:
    """One table per layout and registry (what a plugin's registration warns is said once)."""
    return Layouts(layout, builtins, registry, base)


def show(value: Any, limit: int = 60) -> str:
    """A config value for a message: its repr, cut to ``limit`` characters (an integer beyond 128
    bits by its magnitude)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}~1e{int(math.log10(abs(value)))}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse(config: Mapping[str, Any], supported: Mapping[str, Any]) -> list[str]:
    """Problems for config fields set to values gptzoo does not implement, and for quantized weights."""
    problems = [
        f"config.json {key}={show(config[key])} is not supported (gptzoo implements {key}={value!r} only)"
        for key, value in supported.items()
        if key in config and config[key] is not None and config[key] != value
    ]
    if config.get("quantization_config") is not None:
        problems.append(
            f"config.json quantization_config={show(config['quantization_config'])} is not supported (gptzoo "
            f"reads plain {WEIGHT_DTYPES_TEXT} weights); use the checkpoint's unquantized weights"
        )
    return problems


class Fields:
    """Typed reads of config.json fields; each wrong one adds a problem naming it. An absent field
    takes its default (null too for integers and objects, where Hugging Face writes null for unset)."""

    def __init__(self, config: Mapping[str, Any], prefix: str = "config.json ") -> None:
        self.config, self.prefix = config, prefix
        self.problems: list[str] = []

    def _wrong(self, key: str, what: str) -> None:
        self.problems.append(f"{self.prefix}{key}={show(self.config[key])} is not {what}")

    def integer(self, key: str, default: int | None = None) -> int:
        """A positive integer; without a default the field is required."""
        value = self.config.get(key)
        if value is None:
            if default is None:
                self.problems.append(f"{self.prefix.rstrip(' .')} has no {key!r}")
            return 1 if default is None else default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self._wrong(key, "a positive integer")
            return 1
        return value

    def number(self, key: str, default: float) -> float:
        if key not in self.config:
            return default
        value = self.config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._wrong(key, "a finite number")
            return default
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            self._wrong(key, "a finite number (it is beyond a float's range)")
            return default
        if not math.isfinite(number):
            self._wrong(key, "a finite number")
            return default
        return number

    def flag(self, key: str, default: bool) -> bool:
        if key not in self.config:
            return default
        if not isinstance(self.config[key], bool):
            self._wrong(key, "true or false")
            return default
        return self.config[key]

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.config.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self._wrong(key, "an object")
            return {}
        return value

    def choice(self, key: str, default: str, table: Mapping[str, str]) -> str:
        """table[the field's value], or a problem naming the value and what is supported."""
        value = self.config.get(key, default)
        if isinstance(value, str) and value in table:
            return table[value]
        hint = did_you_mean(value, list(table)) if isinstance(value, str) else f" (available: {', '.join(table)})"
        self.problems.append(f"{self.prefix}{key} {show(value)} is not supported{hint}")
        return next(iter(table.values()))

    def layer_types(self, n_layer: int, kinds: tuple[str, str], default: Callable[[], list[str]]) -> list[str]:
        """The layer_types field: a list of ``n_layer`` entries, each one of ``kinds`` (else a problem naming it,
        and every layer the last kind); ``default()`` where the field is absent."""
        types = self.config.get("layer_types")
        if types is None:
            return default()
        if not isinstance(types, list) or len(types) != n_layer or not all(t in kinds for t in types):
            self.problems.append(
                f"{self.prefix}layer_types={show(types)} is not a list of {n_layer} {kinds[0]!r} or {kinds[1]!r} "
                "entries"
            )
            return [kinds[-1]] * n_layer
        return types

    def check(self) -> None:
        """GptzooError with every problem found so far."""
        if self.problems:
            raise GptzooError("; ".join(self.problems))

"""The recipe's shape: frozen dataclasses for each section, and writing a resolved recipe as TOML.

A recipe names components by registry key, either as a string (``norm = "rmsnorm"``) or as a table
whose other keys are the component's parameters (``norm = { name = "layernorm", eps = 1e-5 }``); a
key is a bare name or one qualified by its distribution (``gptzoo-extras:sliding_window``).
Nothing here reads files or consults the registry: see gptzoo.recipe.load and gptzoo.recipe.validate.

A resolved recipe records where each component came from (validation fills ``Component.origin``
from the registry), and its TOML ends with that as a ``[provenance]`` table, by [model] key, with
one entry per sampler step::

    [provenance]
    norm = "gptzoo 0.1.0"
    attention = "gptzoo-extras 1.2.0"
    samplers = ["gptzoo 0.1.0"]

Reading it back, validation only uses it to say which distribution to install when a component is
missing (gptzoo.recipe.validate); a recipe without one (written before it existed) reads as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from gptzoo.defaults import MAX_DIM as MAX_DIM  # defined with the limits the command line checks

if TYPE_CHECKING:
    from gptzoo.registry import Entry

MAX_LAYERS = 4096
"""The most blocks a recipe may have: each is a Python module even on the meta device, so a billion
would take hours and terabytes to describe (published models have at most ~130)."""
MAX_HEADS = 2**16
"""The most attention heads (query or key/value) a recipe may have; published models have at most ~128."""
MAX_TENSOR = 2**40
"""The most elements one weight tensor may have (4 TiB in float32): a bound on products of dimensions,
which each stay within MAX_DIM but could overflow a tensor's size."""
MAX_INIT_STD = 1e3
"""The largest init_std: six standard deviations stay finite in float16 (and far from float32's limit)."""
MAX_INT = 2**63 - 1
"""The largest value of any other integer in a recipe ([train] counts and seed, component parameters): int64."""
NORM_PLACEMENTS = ("pre", "post", "sandwich", "reordered", "parallel")
"""The block's shape, F each sublayer (attention, then mlp): pre: x + F(norm(x)) with a final norm
(GPT-2); post: norm(x + F(x)), no final norm (Vaswani et al.); sandwich: x + norm(F(norm(x))), four
norms a block (Gemma 2 and 3); reordered: x + norm(F(x)) (OLMo 2); parallel: x + attn(norm(x)) +
mlp(norm(x)), both sublayers reading the block's input (GPT-NeoX, GPT-J). All but post end with a final norm."""


@dataclass(frozen=True)
class Component:
    """A registry key and the keyword parameters its factory gets from the recipe."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    """(parameter, value) pairs in recipe order: immutable, hashable and copyable."""
    origin: str = field(default="", compare=False)
    """``gptzoo-extras 1.2.0``: the distribution and version of the entry validation resolved the name
    to ("" before validation); not part of a recipe's identity (an upgraded plugin builds the same model)."""
    entry: Entry | None = field(default=None, compare=False, repr=False)
    """The registry entry validation resolved the name to (None before validation), so that the builder,
    the summary and the export use what validation decided rather than looking the name up again
    (gptzoo.recipe.validate.entry_of). Never written (TOML, recipe.toml, checkpoints) nor pickled: a
    copy in another process looks its name up in that process's registry."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "entry": None}

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_toml_value(self) -> str | dict[str, Any]:
        return {"name": self.name, **self.kwargs} if self.params else self.name


@dataclass(frozen=True)
class LayerType:
    """One entry of [model.layer_types]: the components that layers of this type use instead of
    [model]'s (None: [model]'s), and where their norms sit. A layer type names components as [model]
    does; a table without a name changes parameters of [model]'s component (``position = { theta = 1e4 }``)."""

    norm: Component | None = None
    activation: Component | None = None
    mlp: Component | None = None
    position: Component | None = None
    attention: Component | None = None
    norm_placement: str | None = None
    """The norm placement of layers of this type (None: [model]'s): OLMo Hybrid's attention layers
    normalize each sublayer's output ("reordered") while its DeltaNet layers are Pre-LN."""

    def overrides(self) -> dict[str, Component]:
        """[model] key -> this type's component, for the component keys it sets."""
        return {f.name: c for f in fields(self) if isinstance(c := getattr(self, f.name), Component)}


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
    scale_embeddings: bool = False
    """Multiply the token embeddings by sqrt(n_embd), rounded to the embeddings' dtype (Gemma)."""
    logit_softcap: float = 0.0
    """Final logit soft-capping: logits = c * tanh(logits / c) (Gemma 2); 0 turns it off."""
    embedding_multiplier: float = 1.0
    """Multiply the token embeddings by this, rounded to their dtype first (Granite); 1 leaves them."""
    residual_multiplier: float = 1.0
    """Scale each sublayer's output by this before the residual stream adds it (Granite); 1 leaves it."""
    logits_scaling: float = 1.0
    """Divide the logits by this, before any soft-capping (Granite's logits_scaling); 1 leaves them."""
    layer_pattern: tuple[str, ...] = ()
    """The layer type of each block, by name of [model.layer_types], repeated over n_layer when shorter
    and cut when longer (``["sliding", "sliding", "sliding", "sliding", "sliding", "full"]`` is Gemma 3's
    5:1, so ``--set model.n_layer=2`` keeps two sliding layers); empty: every layer is built from
    [model] alone."""
    layer_types: tuple[tuple[str, LayerType], ...] = ()
    """(name, LayerType) pairs, in recipe order: what each layer type changes."""

    def __post_init__(self) -> None:
        if not self.n_kv_head:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if not self.head_dim and self.n_head:
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)

    def schedule(self) -> list[str]:
        """The layer type name of each block ("" for every block when there is no layer_pattern)."""
        pattern = self.layer_pattern or ("",)
        return [pattern[i % len(pattern)] for i in range(self.n_layer)]

    def placement(self, layer_type: str) -> str:
        """The norm placement of layers of this type ("" for [model]'s own)."""
        return dict(self.layer_types).get(layer_type, LayerType()).norm_placement or self.norm_placement

    def layer_components(self, layer_type: str) -> dict[str, Component]:
        """[model] key -> the component layers of this type (by name; "" for [model]'s own) use."""
        components = {key: getattr(self, key) for key in COMPONENT_KEYS}
        return {**components, **dict(self.layer_types).get(layer_type, LayerType()).overrides()}


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
    aux_loss_weight: float = 0.01
    """The factor on the model's auxiliary losses (its components' ``aux_losses``, e.g. a router's load
    balancing) added to the training loss; 0: logged, not trained on. 0.01 is OLMoE's router coefficient."""
    peak_tflops: float = 0.0
    """The device's peak FLOP/s (in TFLOP/s) that MFU is measured against; 0: measure it with a matmul at
    start-up (gptzoo.training.trainer.peak_of; an MFU above 1 is dropped, the peak being too low)."""
    data: str = ""
    """The prepared data directory (`gptzoo prepare`), relative to the recipe file that sets it (to the
    working directory when --set sets it); --data overrides."""


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
        model["layer_pattern"] = list(self.model.layer_pattern)
        model["layer_types"] = {
            name: {
                **{key: c.to_toml_value() for key, c in layer.overrides().items()},
                **({"norm_placement": layer.norm_placement} if layer.norm_placement else {}),
            }
            for name, layer in self.model.layer_types
        }
        for key in ("scale_embeddings", "logit_softcap", "layer_pattern", "layer_types"):
            if not model[key]:  # written only when set: recipes from before them read back the same
                del model[key]
        for key in MULTIPLIERS:
            if model[key] == 1.0:
                del model[key]
        # Defaults stay implicit, so that `--set model.n_embd=...` on a written recipe still derives them.
        if model["n_kv_head"] == model["n_head"]:
            del model["n_kv_head"]
        if model["head_dim"] * model["n_head"] == model["n_embd"]:  # only an exact split derives it back
            del model["head_dim"]
        data: dict[str, Any] = (
            {"description": self.description, "model": model} if self.description else {"model": model}
        )
        if self.tokenizer is not None:
            data["tokenizer"] = {"name": self.tokenizer.name}
        if self.weights is not None:
            data["weights"] = {"hf": self.weights.hf}
        if self.generate != GenerateSpec():
            g = self.generate
            data["generate"] = {
                "samplers": [{"name": c.name, **c.kwargs} for c in g.samplers],
                "max_new_tokens": g.max_new_tokens,
                "stop": list(g.stop),
            }
        if self.train != TrainSpec():
            data["train"] = {
                f.name: getattr(self.train, f.name)
                for f in fields(TrainSpec)
                if getattr(self.train, f.name) != f.default
            }
        provenance: dict[str, Any] = {
            key: getattr(self.model, key).origin
            for key in COMPONENT_KEYS
            if ORIGIN.fullmatch(getattr(self.model, key).origin)
        }
        layer_origins = {
            name: {key: c.origin for key, c in layer.overrides().items() if ORIGIN.fullmatch(c.origin)}
            for name, layer in self.model.layer_types
        }
        if any(layer_origins.values()):
            provenance[LAYER_TYPES] = {name: origins for name, origins in layer_origins.items() if origins}
        samplers = self.generate.samplers
        if "generate" in data and samplers and all(ORIGIN.fullmatch(c.origin) for c in samplers):
            provenance[SAMPLERS] = [c.origin for c in self.generate.samplers]
        if provenance:
            data[PROVENANCE] = provenance
        return data

    def to_toml(self) -> str:
        return dump_toml(self.to_dict())


SECTIONS: dict[str, type] = {
    "model": ModelSpec,
    "tokenizer": TokenizerSpec,
    "weights": WeightsSpec,
    "generate": GenerateSpec,
    "train": TrainSpec,
}
ORIGIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,99}) ([A-Za-z0-9][A-Za-z0-9._+!-]{0,63})")
"""A [provenance] value: ``DISTRIBUTION VERSION`` (an origin that is not, from a distribution of an odd
name, is left out rather than written as something that reading back would refuse)."""
TOP_LEVEL_KEYS = ("extends", "description")
PROVENANCE = "provenance"
"""The table of a resolved recipe that records each component's distribution and version."""
SAMPLERS = "samplers"
"""The [provenance] key of the sampler chain's steps (the others are [model] component keys)."""
LAYER_TYPES = "layer_types"
"""The [model] key of the layer types, and the [provenance] key of their components (by type, then [model] key)."""
MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling")
"""[model] keys that scale the embeddings, the sublayers' outputs and the logits (1: not at all)."""
COMPONENT_KEYS = tuple(f.name for f in fields(ModelSpec) if f.type in ("Component", Component))
"""[model] keys that name a component; each is the recipe_key of one kind in gptzoo.hookspecs.CONTRACTS."""


def merge_component(base: Any, child: Any) -> Any:
    """A component value over its parent's: a table without ``name`` changes the parent component's
    parameters (``{ theta = 5e5 }`` over ``{ name = "rope", theta = 1e4 }``); anything else replaces it.
    Over no parent component (or a malformed one) the child stands as written, for validation to judge."""
    if not isinstance(child, dict) or "name" in child:
        return child
    if isinstance(base, str):
        return {"name": base, **child}
    if isinstance(base, dict) and "name" in base:
        return {**base, **child}
    return child


# --- writing --------------------------------------------------------------------------------------


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _toml_string(text: str) -> str:
    """A TOML basic string that reads back as ``text``: quotes, backslashes and control, format and
    separator characters (NUL, DEL, RTL marks, U+2028...) escaped, everything else as it is.
    A lone surrogate is left raw, so that writing it fails rather than leaving unreadable TOML."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable() or "\ud800" <= ch <= "\udfff":
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else _toml_string(key)


def toml_value(value: Any) -> str:
    """One TOML value as it is written after ``key = `` (or in a ``--set K=V``).

    Raises:
        TypeError: a value TOML cannot hold as written here (a date, None).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML for recipe data: top-level scalars, then one table per section."""
    lines = [f"{_toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for section, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{_toml_key(section)}]", *(f"{_toml_key(k)} = {toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines).lstrip("\n") + "\n"


def show(value: Any) -> str:
    """A value for a one-line message: its repr, an integer beyond 128 bits by magnitude, long text cut."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}~1e{int(math.log10(abs(value)))}"
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # holds an integer of more digits than repr writes
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def describe(value: Any) -> str:
    return f"{show(value)} ({type(value).__name__})"

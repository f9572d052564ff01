"""Llama-family checkpoints as Hugging Face stores them (LlamaForCausalLM; Touvron et al., 2023).

Keys: ``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``model.norm``, ``lm_head`` (absent when
tied). nn.Linear layout [out, in]; RoPE in the rotate-half convention, as gptzoo's rope.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gptzoo.hf.family import Family, Fields, Part, refuse, show
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe

ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "relu": "relu",
}
"""config.json hidden_act -> gptzoo activation (HF ACT2FN semantics)."""
PREFIX = "model."


class RopeType(NamedTuple):
    """One of transformers' rope types as gptzoo implements it."""

    position: str
    """The registry name of gptzoo's position."""
    component: str
    """The reference of its class (its layouts write rope_scaling from it)."""
    fields: dict[str, tuple[str, str]]
    """Its config fields -> (the position's parameter, which its class keeps as an attribute of that name;
    how to read the field)."""


POSITIONS = "gptzoo_plugins._positions:"
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType("rope", POSITIONS + "RoPE", {}),
    "linear": RopeType("rope_linear", POSITIONS + "LinearRoPE", {"factor": ("factor", "number")}),
    "dynamic": RopeType("rope_dynamic", POSITIONS + "DynamicRoPE", {"factor": ("factor", "number")}),
    "llama3": RopeType(
        "rope_llama3",
        POSITIONS + "Llama3RoPE",
        {
            "factor": ("factor", "number"),
            "low_freq_factor": ("low_freq_factor", "number"),
            "high_freq_factor": ("high_freq_factor", "number"),
            "original_max_position_embeddings": ("original_context", "integer"),
        },
    ),
    "yarn": RopeType(
        "rope_yarn",
        POSITIONS + "YaRNRoPE",
        {
            "factor": ("factor", "number"),
            "original_max_position_embeddings": ("original_context", "integer"),
            "beta_fast": ("beta_fast", "number"),
            "beta_slow": ("beta_slow", "number"),
            "mscale": ("mscale", "number"),
            "mscale_all_dim": ("mscale_all_dim", "number"),
            "attention_factor": ("attention_factor", "number"),
            "truncate": ("truncate", "flag"),
        },
    ),
}
"""transformers' rope_type -> gptzoo's position, its class and its parameters: read on import, written on export."""
ROPE_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor",),
}
"""The fields each rope type must have (transformers refuses the config without them)."""


def rope_position(
    f: Fields,
    context_length: int,
    *,
    parameters: Mapping[str, Any] | None = None,
    scaling: Mapping[str, Any] | None = None,
    fraction: float = 1.0,
) -> dict[str, Any]:
    """The rope position component of a config.json: transformers 4.x writes rope_theta and
    rope_scaling, 5.x rope_parameters (``parameters`` and ``scaling``: a family's per-layer-type
    table instead); rope_scaling wins, as in transformers. Types other than ROPE_TYPES' are refused
    by name."""
    parameters = f.mapping("rope_parameters") if parameters is None else parameters
    scaling = (f.mapping("rope_scaling") or parameters) if scaling is None else scaling
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        f.problems.append(
            f"config.json rope scaling type {show(kind)} is not supported (gptzoo implements {', '.join(ROPE_TYPES)})"
        )
        kind = "default"
    if "rope_theta" in parameters:
        inner = Fields(parameters, "config.json rope_parameters.")
        theta = inner.number("rope_theta", 10000.0)
        f.problems += inner.problems
    else:
        theta = f.number("rope_theta", 10000.0)
    name, _, fields = ROPE_TYPES[kind]
    missing = [key for key in ROPE_REQUIRED.get(kind, ()) if scaling.get(key) is None]
    if missing:
        f.problems.append(f"config.json rope scaling type {kind!r} needs {', '.join(missing)}, and has none")
    position: dict[str, Any] = {"name": name, "theta": theta}
    if fraction != 1.0:
        position["fraction"] = fraction
    read = Fields(scaling, "config.json rope scaling ")
    for key, (param, how) in fields.items():
        if scaling.get(key) is None:
            if key == "original_max_position_embeddings" and kind == "yarn":
                position[param] = context_length  # transformers' default
            continue
        position[param] = {"number": read.number, "integer": read.integer, "flag": read.flag}[how](key, 0)
    f.problems += read.problems
    return position


def odd_head_dim(recipe: Recipe) -> dict[str, int]:
    """{"head_dim": ...} when it is not hidden_size / num_attention_heads, else nothing."""
    m = recipe.model
    return {"head_dim": m.head_dim} if m.head_dim * m.n_head != m.n_embd else {}


def plain_embeddings_and_logits(recipe: Recipe, title: str) -> list[str]:
    """Why the recipe's scaled embeddings or soft-capped logits have no place in a family without them."""
    m, reasons = recipe.model, []
    if m.scale_embeddings:
        reasons.append(f"scale_embeddings=true ({title} does not scale its embeddings)")
    if m.logit_softcap:
        reasons.append(f"logit_softcap={m.logit_softcap} ({title} does not soft-cap its logits)")
    return reasons


def rope_scaling(position: Any, rope_type: str) -> dict[str, Any]:
    """transformers' rope scaling object of a position of that rope type: its fields, read from the
    position's parameters; a number left at 0 is unset and not written."""
    scaling: dict[str, Any] = {"rope_type": rope_type}
    for key, (param, _) in ROPE_TYPES[rope_type].fields.items():
        value = getattr(position, param)
        if type(value) is bool or value != 0:
            scaling[key] = value
    return scaling


def rope_fields(theta: str, fraction: str, *, always_fraction: bool = False) -> Any:
    """The config function of a rope position's layout, one per rope type: its base under ``theta``,
    its rotary fraction under ``fraction`` (when some features pass through, or ``always_fraction``),
    its scaling as rope_scaling."""

    def layouts(rope_type: str) -> Any:
        def config(position: Any) -> dict[str, Any]:
            fields: dict[str, Any] = {theta: position.theta}
            if always_fraction or position.fraction != 1.0:
                fields[fraction] = position.fraction
            if rope_type != "default":
                fields["rope_scaling"] = rope_scaling(position, rope_type)
            if position.rotate_in_float32:
                fields["rope_rotate_in_float32"] = True
            return fields

        return config

    return layouts


def rope_layouts(layout: str, config: Any) -> tuple[Any, ...]:
    """The layout of every rope type's position: nothing stored (its tables are computed), ``config``'s fields."""
    return tuple(builtin(t.component, layout, lambda position: [], config(name)) for name, t in ROPE_TYPES.items())


def _pre_attn_scalar(attn: Any) -> object:
    """A scale other than 1/sqrt(head_dim), as Gemma writes it: an integer where it can be (256 from 0.0625)."""
    if attn.scale == 1.0 / math.sqrt(attn.head_dim):
        return None
    scalar = attn.scale**-2
    return round(scalar) if math.isclose(scalar, round(scalar), rel_tol=1e-9) else scalar


ATTENTION_FEATURES: dict[str, tuple[str, Callable[[Any], object]]] = {
    "window": ("sliding_window", lambda attn: attn.window or None),
    "softcap": ("attn_logit_softcapping", lambda attn: attn.softcap or None),
    "scale": ("query_pre_attn_scalar", _pre_attn_scalar),
    "qk_norm": ("qk_norm", lambda attn: None if attn.qk_norm == "none" else attn.qk_norm),
    "qkv_bias": ("qkv_bias", lambda attn: True if attn.c_attn.bias is not None and attn.c_proj.bias is None else None),
    "sinks": ("sinks", lambda attn: True if attn.sinks is not None else None),
    "output_gate": ("attn_output_gate", lambda attn: True if getattr(attn, "output_gate", False) else None),
}
"""The features of gptzoo's attention beyond plain causal attention: feature -> (the config.json field
that expresses it, its value for an attention, None where the attention does without it). Every
family's attention layout writes them through :func:`attention_fields`; a family expresses a feature
by having its field (``Family.known`` and the rest), and refuses the others by name. A new feature is
one row here and the families that can express it, nothing else."""


def attention_fields(attn: Any) -> dict[str, object]:
    """The config.json fields of the attention's features (:data:`ATTENTION_FEATURES`) it has."""
    return {field: value for field, read in ATTENTION_FEATURES.values() if (value := read(attn)) is not None}


def kinds(linear: Any) -> tuple[str, ...]:
    """The tensors of an nn.Linear: weight, and bias if it has one."""
    return ("weight", "bias") if linear.bias is not None else ("weight",)


def attention_maps(attn: Any, *, at: str = "", out: str = "o_proj") -> list[TensorMap]:
    """c_attn split into q_proj, k_proj and v_proj; c_proj is o_proj (or ``out``); attention sinks are sinks
    (gpt-oss); all under ``at`` (LFM2's "self_attn.", where the layer is the part)."""
    q = (2 if getattr(attn, "output_gate", False) else 1) * attn.n_head * attn.head_dim  # with its gate's rows
    kv = attn.n_kv_head * attn.head_dim
    maps = [
        TensorMap(f"c_attn.{k}", (f"{at}q_proj.{k}", f"{at}k_proj.{k}", f"{at}v_proj.{k}"), sizes=(q, kv, kv))
        for k in kinds(attn.c_attn)
    ]
    maps += [TensorMap(f"c_proj.{k}", (f"{at}{out}.{k}",)) for k in kinds(attn.c_proj)]
    return maps + ([TensorMap("sinks", ("sinks",))] if attn.sinks is not None else [])


def gated_mlp_maps(mlp: Any, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> list[TensorMap]:
    """c_fc ([gate; up]) split into gate_proj and up_proj; c_proj is down_proj (``names``: theirs otherwise)."""
    d_ff, (gate, up, down) = mlp.c_proj.in_features, names
    return [
        *(TensorMap(f"c_fc.{k}", (f"{gate}.{k}", f"{up}.{k}"), sizes=(d_ff, d_ff)) for k in kinds(mlp.c_fc)),
        *(TensorMap(f"c_proj.{k}", (f"{down}.{k}",)) for k in kinds(mlp.c_proj)),
    ]


ACTIVATION_NAMES = {
    "gptzoo_plugins._activations:GELU": "gelu",
    "gptzoo_plugins._activations:GELUTanh": "gelu_pytorch_tanh",
    "gptzoo_plugins._activations:ReLU": "relu",
    "gptzoo_plugins._activations:SiLU": "silu",
}
"""The built-in activations' names in hidden_act (HF ACT2FN), in Llama and the families that name them as it does."""


def activation_layouts(layout: str) -> tuple[Any, ...]:
    return tuple(
        builtin(component, layout, lambda act: [], lambda act, name=name: {"hidden_act": name})
        for component, name in ACTIVATION_NAMES.items()
    )


def rmsnorm_fields(norm: Any) -> dict[str, Any]:
    # scale_in_float32 only when set: a family that does not imply it has no field for it, and refuses these numerics
    return {"rms_norm_eps": norm.eps, **({"rms_norm_scale_in_float32": True} if norm.scale_in_float32 else {})}


LAYOUT = (
    builtin("gptzoo_plugins._norms:RMSNorm", "llama", lambda norm: same("weight"), rmsnorm_fields),
    builtin(
        "gptzoo_plugins._norms:GemmaRMSNorm",
        "llama",
        lambda norm: same("weight"),
        lambda norm: {"rms_norm_eps": norm.eps, "rms_norm_offset": 1.0},
    ),
    *activation_layouts("llama"),
    builtin("gptzoo_plugins._mlps:GatedMLP", "llama", gated_mlp_maps),
    *rope_layouts("llama", rope_fields("rope_theta", "partial_rotary_factor")),
    builtin(
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "llama",
        attention_maps,
        attention_fields,
        children=("q_norm", "k_norm"),
    ),
)
"""The "llama" layout of the built-in components."""


class Llama(Family):
    name = "llama"
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    embedding = PREFIX + "embed_tokens.weight"
    ignored_tensors = (".rotary_emb.inv_freq",)
    title = "Llama"
    required = {"rms_norm_eps": "norm", "hidden_act": "activation", "rope_theta": "position"}
    known = frozenset({"rope_scaling"})
    component_layouts = LAYOUT

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head = sizes["n_embd"], sizes["n_head"]
        head_dim = f.integer("head_dim", n_embd // n_head)
        attention_bias, mlp_bias = f.flag("attention_bias", False), f.flag("mlp_bias", False)
        model = {
            **sizes,
            **({"head_dim": head_dim} if head_dim != n_embd // n_head else {}),
            "bias": attention_bias,
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-6)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": rope_position(f, sizes["context_length"]),
            "attention": "causal",
        }
        if attention_bias != mlp_bias:
            f.problems.append(
                f"config.json attention_bias={attention_bias} with mlp_bias={mlp_bias} is not supported "
                "(gptzoo's bias covers both)"
            )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        placement = recipe.model.norm_placement
        reasons = [] if placement == "pre" else [f"norm_placement {placement!r} (Llama is Pre-LN)"]
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        return {**self.write_sizes(recipe), "head_dim": m.head_dim, "attention_bias": m.bias, "mlp_bias": m.bias}

    block_parts: Mapping[str, str] = {
        "ln_1": "input_layernorm",
        "attn": "self_attn",
        "ln_2": "post_attention_layernorm",
        "mlp": "mlp",
    }
    """Our block's parts -> theirs, under model.layers.N ("": the layer itself, for a hybrid family whose layers
    hold one token mixer or another under different names: each mixer's layout then names its own place)."""

    def parts_of(self, block: Any) -> Mapping[str, str]:
        """The block's parts -> theirs (:attr:`block_parts`; a family whose layers place their norms
        differently by layer type names each block's own)."""
        return self.block_parts

    prefix = PREFIX
    """Where the decoder's tensors are (a vision-language checkpoint keeps its text model under another)."""
    final_norm = "norm"
    """Their name of the final norm, under the prefix."""

    def parts(self, model: GPT) -> list[Part]:
        weight, prefix = same("weight"), self.prefix
        parts = [Part(model.wte, "wte.", prefix + "embed_tokens.", weight), Part(model.position, "position.", prefix)]
        parts += [Part(p, f"layer_positions.{i}.", prefix) for i, p in enumerate(model.layer_positions)]
        for i, block in enumerate(model.blocks):
            parts += [
                Part(
                    getattr(block, ours), f"blocks.{i}.{ours}.", f"{prefix}layers.{i}.{theirs + '.' if theirs else ''}"
                )
                for ours, theirs in self.parts_of(block).items()
            ]
        parts.append(Part(model.ln_f, "ln_f.", f"{prefix}{self.final_norm}."))
        if not model.tied:
            parts.append(Part(model.lm_head, "lm_head.", "lm_head.", weight))
        return parts

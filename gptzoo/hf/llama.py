"""Llama-family checkpoints as Hugging Face stores them (LlamaForCausalLM; Touvron et al., 2023).

Keys: ``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``model.norm``, ``lm_head`` (absent when
tied). nn.Linear layout [out, in]; RoPE in the rotate-half convention, as gptzoo's rope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Family, Fields, Part, refuse, show
from gptzoo.interfaces import TensorMap
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


ROPE_TYPES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "default": ("rope", {}),
    "linear": ("rope_linear", {"factor": ("factor", "number")}),
    "dynamic": ("rope_dynamic", {"factor": ("factor", "number")}),
    "llama3": (
        "rope_llama3",
        {
            "factor": ("factor", "number"),
            "low_freq_factor": ("low_freq_factor", "number"),
            "high_freq_factor": ("high_freq_factor", "number"),
            "original_max_position_embeddings": ("original_context", "integer"),
        },
    ),
    "yarn": (
        "rope_yarn",
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
"""transformers' rope_type -> (gptzoo position, {its config field: (the position's parameter, how to read it)})."""
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
    name, fields = ROPE_TYPES[kind]
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


def sizes(recipe: Recipe) -> dict[str, Any]:
    """The config.json sizes that Llama and the families shaped like it share (head_dim aside: some
    write it always, some only when it is not hidden_size / num_attention_heads)."""
    m = recipe.model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.n_embd,
        "intermediate_size": m.d_ff,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.n_kv_head,
        "max_position_embeddings": m.context_length,
        "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": m.init_std,
    }


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


class Llama(Family):
    name = "llama"
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    embedding = PREFIX + "embed_tokens.weight"
    ignored_tensors = (".rotary_emb.inv_freq",)
    title = "Llama"
    required = {"rms_norm_eps": "norm", "hidden_act": "activation", "rope_theta": "position"}
    known = frozenset({"rope_scaling"})

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        n_embd, n_head = f.integer("hidden_size"), f.integer("num_attention_heads")
        head_dim = f.integer("head_dim", n_embd // n_head)
        attention_bias, mlp_bias = f.flag("attention_bias", False), f.flag("mlp_bias", False)
        context_length = f.integer("max_position_embeddings", 2048)
        model = {
            "vocab_size": f.integer("vocab_size"),
            "context_length": context_length,
            "n_layer": f.integer("num_hidden_layers"),
            "n_head": n_head,
            "n_kv_head": f.integer("num_key_value_heads", n_head),
            "n_embd": n_embd,
            **({"head_dim": head_dim} if head_dim != n_embd // n_head else {}),
            "d_ff": f.integer("intermediate_size"),
            "bias": attention_bias,
            "tie_embeddings": f.flag("tie_word_embeddings", False),
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-6)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": rope_position(f, context_length),
            "attention": "causal",
            "init_std": f.number("initializer_range", 0.02),
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
        return {**sizes(recipe), "head_dim": m.head_dim, "attention_bias": m.bias, "mlp_bias": m.bias}

    block_parts: Mapping[str, str] = {
        "ln_1": "input_layernorm",
        "attn": "self_attn",
        "ln_2": "post_attention_layernorm",
        "mlp": "mlp",
    }
    """Our block's parts -> theirs, under model.layers.N."""

    def parts(self, model: GPT) -> list[Part]:
        same = [TensorMap("weight", ("weight",))]
        parts = [Part(model.wte, "wte.", PREFIX + "embed_tokens.", same), Part(model.position, "position.", PREFIX)]
        parts += [Part(p, f"layer_positions.{i}.", PREFIX) for i, p in enumerate(model.layer_positions)]
        for i, block in enumerate(model.blocks):
            parts += [
                Part(getattr(block, ours), f"blocks.{i}.{ours}.", f"{PREFIX}layers.{i}.{theirs}.")
                for ours, theirs in self.block_parts.items()
            ]
        parts.append(Part(model.ln_f, "ln_f.", PREFIX + "norm."))
        if not model.tied:
            parts.append(Part(model.lm_head, "lm_head.", "lm_head.", same))
        return parts

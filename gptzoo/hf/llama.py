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


def rope_theta(f: Fields) -> float:
    """theta; transformers 4.x writes rope_theta and rope_scaling, 5.x rope_parameters. Scaling is refused."""
    parameters = f.mapping("rope_parameters")
    scaling = f.mapping("rope_scaling") or parameters  # as in transformers, rope_scaling wins
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        f.problems.append(f"config.json rope scaling type {show(kind)} is not supported (gptzoo implements plain RoPE)")
    if "rope_theta" not in parameters:
        return f.number("rope_theta", 10000.0)
    inner = Fields(parameters, "config.json rope_parameters.")
    theta = inner.number("rope_theta", 10000.0)
    f.problems += inner.problems
    return theta


class Llama(Family):
    name = "llama"
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    embedding = PREFIX + "embed_tokens.weight"
    ignored_tensors = (".rotary_emb.inv_freq",)
    title = "Llama"
    required = {"rms_norm_eps": "norm", "hidden_act": "activation", "rope_theta": "position"}

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        n_embd, n_head = f.integer("hidden_size"), f.integer("num_attention_heads")
        head_dim = f.integer("head_dim", n_embd // n_head)
        attention_bias, mlp_bias = f.flag("attention_bias", False), f.flag("mlp_bias", False)
        model = {
            "vocab_size": f.integer("vocab_size"),
            "context_length": f.integer("max_position_embeddings", 2048),
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
            "position": {"name": "rope", "theta": rope_theta(f)},
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
        return [] if placement == "pre" else [f"norm_placement {placement!r} (Llama is Pre-LN)"]

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        return {
            "vocab_size": m.vocab_size,
            "hidden_size": m.n_embd,
            "intermediate_size": m.d_ff,
            "num_hidden_layers": m.n_layer,
            "num_attention_heads": m.n_head,
            "num_key_value_heads": m.n_kv_head,
            "head_dim": m.head_dim,
            "max_position_embeddings": m.context_length,
            "attention_bias": m.bias,
            "mlp_bias": m.bias,
            "tie_word_embeddings": m.tie_embeddings,
            "initializer_range": m.init_std,
        }

    def parts(self, model: GPT) -> list[Part]:
        same = [TensorMap("weight", ("weight",))]
        parts = [Part(model.wte, "wte.", PREFIX + "embed_tokens.", same), Part(model.position, "position.", PREFIX)]
        names = {"ln_1": "input_layernorm", "attn": "self_attn", "ln_2": "post_attention_layernorm", "mlp": "mlp"}
        for i, block in enumerate(model.blocks):
            parts += [
                Part(getattr(block, ours), f"blocks.{i}.{ours}.", f"{PREFIX}layers.{i}.{theirs}.")
                for ours, theirs in names.items()
            ]
        parts.append(Part(model.ln_f, "ln_f.", PREFIX + "norm."))
        if not model.tied:
            parts.append(Part(model.lm_head, "lm_head.", "lm_head.", same))
        return parts

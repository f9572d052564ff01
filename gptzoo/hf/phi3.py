"""Phi-3 checkpoints as Hugging Face stores them (Phi3ForCausalLM; Abdin et al., 2024).

A Llama block (RMSNorm, Pre-LN, gated MLP, RoPE, GQA-capable) whose projections are fused as gptzoo
fuses them: ``self_attn.qkv_proj`` holds the q, k and v rows one after another (gptzoo's c_attn as it
is) and ``mlp.gate_up_proj`` the gate rows then the up rows (gptzoo's gated c_fc as it is). Keys:
``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn.{qkv_proj, o_proj},
post_attention_layernorm, mlp.{gate_up_proj, down_proj}}``, ``model.norm``, ``lm_head``. No biases
(transformers hard-codes them off and ignores ``attention_bias``). ``sliding_window``, when set,
applies to every layer (Phi-3-mini-4k: 2047 keys). RoPE: ``rope_theta``, ``partial_rotary_factor``;
the long-context variants' ``longrope`` (also written "su" or "yarn" in Phi-3 configs) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.llama import (
    ACTIVATIONS,
    Llama,
    activation_layouts,
    attention_fields,
    kinds,
    odd_head_dim,
    plain_embeddings_and_logits,
    rmsnorm_fields,
    rope_fields,
    rope_layouts,
)
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe

LONGROPE = ("longrope", "su", "yarn")
"""Rope types a Phi-3 config may name for its longrope (transformers renames su and yarn to it)."""


def no_biases(module: Any) -> bool:
    return all(getattr(module, name).bias is None for name in ("c_attn", "c_fc", "c_proj") if hasattr(module, name))


LAYOUT = (
    builtin("gptzoo_plugins._norms:RMSNorm", "phi3", lambda norm: same("weight"), rmsnorm_fields),
    *activation_layouts("phi3"),
    builtin(  # gate_up_proj is c_fc as it is ([gate; up])
        "gptzoo_plugins._mlps:GatedMLP",
        "phi3",
        lambda mlp: (
            [TensorMap("c_fc.weight", ("gate_up_proj.weight",)), TensorMap("c_proj.weight", ("down_proj.weight",))]
            if no_biases(mlp)
            else None
        ),
    ),
    *rope_layouts("phi3", rope_fields("rope_theta", "partial_rotary_factor")),
    builtin(  # qkv_proj is c_attn as it is (its features are attention_fields')
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "phi3",
        lambda attn: [
            *(TensorMap(f"c_attn.{k}", (f"qkv_proj.{k}",)) for k in kinds(attn.c_attn)),
            *(TensorMap(f"c_proj.{k}", (f"o_proj.{k}",)) for k in kinds(attn.c_proj)),
        ],
        attention_fields,
    ),
)
"""The "phi3" layout of the built-in components: Llama's, with fused projections and no biases."""


class Phi3(Llama):
    """Llama's checkpoint skeleton (block_parts, parts) with the components of the "phi3" layout."""

    name = "phi3"
    layout = "phi3"  # set here: a subclass of Llama would inherit "llama"
    component_layouts = LAYOUT
    model_type = "phi3"
    architecture = "Phi3ForCausalLM"
    title = "Phi-3"
    known = frozenset({"partial_rotary_factor"})  # no rope_scaling: Phi-3's only other type is longrope
    size_defaults = {"context_length": 4096}
    per_layer = frozenset({"sliding_window"})

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head = sizes["n_embd"], sizes["n_head"]
        head_dim = f.integer("head_dim", n_embd // n_head) if n_head else 0
        window = f.integer("sliding_window", 0)
        model = {
            **sizes,
            **({"head_dim": head_dim} if head_dim * n_head != n_embd else {}),
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-5)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": self.rope(f),
            "attention": {"name": "sliding_window", "window": window} if window else "causal",
        }
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    @staticmethod
    def rope(f: Fields) -> dict[str, Any]:
        """The rope position as transformers reads Phi-3's config: rope_scaling, else rope_parameters,
        gives the type (default or longrope only) and, when it has them, rope_theta and
        partial_rotary_factor; the top-level fields of those names (10000, 1.0) give what it lacks."""
        source = "rope_scaling" if f.mapping("rope_scaling") else "rope_parameters"
        table = f.mapping(source)
        kind = table.get("rope_type") or table.get("type") or "default"
        if kind in LONGROPE:
            alias = "" if kind == "longrope" else " (longrope to transformers)"
            f.problems.append(
                f"config.json {source} type {show(kind)}{alias} is not supported: gptzoo has no longrope, the RoPE "
                "of Phi-3's long-context variants; use a 4k-context Phi-3"
            )
        elif kind != "default":
            f.problems.append(
                f"config.json {source} type {show(kind)} is not supported (Phi-3 takes default or longrope)"
            )
        inner = Fields(table, f"config.json {source}.")
        theta = inner.number("rope_theta", 0.0) if "rope_theta" in table else f.number("rope_theta", 10000.0)
        fraction = (
            inner.number("partial_rotary_factor", 0.0)
            if "partial_rotary_factor" in table
            else f.number("partial_rotary_factor", 1.0)
        )
        f.problems += inner.problems
        return {"name": "rope", "theta": theta, **({"fraction": fraction} if fraction != 1.0 else {})}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "pre":
            reasons.append(f"norm_placement {m.norm_placement!r} (Phi-3 is Pre-LN)")
        if m.bias:
            reasons.append("bias=true (Phi-3 has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        # Phi3Config's default pad_token_id, 32000, is no token of a smaller vocabulary
        return {**self.write_sizes(recipe), **odd_head_dim(recipe), "pad_token_id": None}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        windows = values["sliding_window"]
        distinct = list(dict.fromkeys(windows))
        if len(distinct) > 1:
            shown = ", ".join("none" if w is None else str(w) for w in distinct)
            reasons.append(f"sliding_window differs between layers ({shown}); Phi-3's applies to every layer")
        return {"sliding_window": windows[0] if windows else None}

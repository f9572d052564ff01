"""OLMoE checkpoints as Hugging Face stores them (OlmoeForCausalLM; Muennighoff et al., 2024).

Llama's keys and Pre-LN block (gptzoo.hf.llama) with OLMo 2's query and key norms over the whole q and k
projections (``self_attn.q_norm``/``k_norm``: gptzoo's qk_norm "full"; Llama's RMSNorm numerics, unlike
OLMo 2's) and a mixture of experts in every layer: under ``model.layers.N.mlp``, the router ``gate`` and
expert e's ``experts.e.{gate,up,down}_proj``, num_experts experts of intermediate_size, the softmax of
the router's logits, the top num_experts_per_tok kept and renormalized when norm_topk_prob. Biases on
q, k, v and o iff attention_bias, never on the experts; clip_qkv (clamping q, k and v) is refused.
router_aux_loss_coef is the training recipe's ``[train] aux_loss_weight``, not the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse
from gptzoo.hf.llama import ACTIVATIONS, Llama, odd_head_dim, plain_embeddings_and_logits, rope_position
from gptzoo.hf.moe import MOE_LAYER, every_layer_sparse, expert_maps, moe_component, moe_config, moe_layout
from gptzoo.recipe import Recipe

NAMES = {"experts": "num_experts", "top_k": "num_experts_per_tok", "normalize": "norm_topk_prob"}
"""The routing features OlmoeConfig has fields for."""

LAYOUT = (moe_layout("olmoe", expert_maps, lambda moe: moe_config(moe, NAMES)),)
"""The "olmoe" layout of the built-in components: the mixture of experts; the others are Llama's."""


class Olmoe(Llama):
    name = "olmoe"
    model_type = "olmoe"
    architecture = "OlmoeForCausalLM"
    title = "OLMoE"
    layout = "olmoe"
    extends = Llama()
    component_layouts = LAYOUT
    per_layer = frozenset({MOE_LAYER})
    known = frozenset({*Llama.known, *NAMES.values()})
    size_defaults = {
        "vocab_size": 50304,
        "n_embd": 2048,
        "n_head": 16,
        "n_layer": 16,
        "d_ff": 2048,
        "context_length": 4096,
    }
    implied: Mapping[str, Any] = {"qk_norm": "full"}

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        model = {
            **sizes,
            "bias": f.flag("attention_bias", False),
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-5)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": moe_component(
                f,
                experts="num_experts",
                aliases=("num_local_experts",),
                experts_default=64,
                top_k_default=8,
                normalize=f.flag("norm_topk_prob", False),
            ),
            "position": rope_position(f, sizes["context_length"]),
            "attention": {"name": "causal", "qk_norm": "full"},
        }
        if model["bias"]:
            f.problems.append(
                "config.json attention_bias=true is not supported (OLMoE's experts have no biases, and gptzoo's "
                "bias covers the attention and the experts alike)"
            )
        f.problems += refuse(config, {"clip_qkv": None})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "pre":
            reasons.append(f"norm_placement {m.norm_placement!r} (OLMoE is Pre-LN)")
        if m.bias:
            reasons.append("bias=true (OLMoE's experts have no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return {**self.write_sizes(recipe), **odd_head_dim(recipe), "attention_bias": recipe.model.bias}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        every_layer_sparse(values, self.title, reasons)
        return {}

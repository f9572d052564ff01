"""Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE checkpoints as Hugging Face stores them (Qwen2MoeForCausalLM,
Qwen3MoeForCausalLM; Qwen Team, 2024 and 2025).

Qwen2's and Qwen3's models (gptzoo.hf.qwen: attention biases, qk norms and sliding windows as there)
with a mixture of experts in the layers that have one: under ``model.layers.N.mlp``, the router
``gate`` and expert e's ``experts.e.{gate,up,down}_proj``, num_experts experts of moe_intermediate_size
(Qwen3MoeConfig also reads num_local_experts), the softmax of the router's logits, the top
num_experts_per_tok kept and renormalized when norm_topk_prob. Qwen2-MoE adds a shared expert of
shared_expert_intermediate_size (``shared_expert``) that every token uses, scaled by
sigmoid(``shared_expert_gate``). The layers with experts are those not in mlp_only_layers whose index
+ 1 is a multiple of decoder_sparse_step; the others have a gated MLP of intermediate_size (in a
recipe: layer type "dense", whose mlp is "gated", and [model] d_ff is intermediate_size).
router_aux_loss_coef is the training recipe's ``[train] aux_loss_weight``, not the model's.
"""

from __future__ import annotations

from typing import Any

from gptzoo.hf.family import Fields
from gptzoo.hf.llama import Llama
from gptzoo.hf.moe import MOE_LAYER, expert_maps, moe_component, moe_config, moe_layout, sparse_config, sparse_layers
from gptzoo.hf.qwen import Qwen2, Qwen3
from gptzoo.recipe import Recipe

NAMES = {
    "experts": "num_experts",
    "top_k": "num_experts_per_tok",
    "normalize": "norm_topk_prob",
    "expert_ff": "moe_intermediate_size",
}
"""The routing features both configs have fields for."""
SHARED = {**NAMES, "shared_ff": "shared_expert_intermediate_size"}
"""Qwen2-MoE's, with its shared expert (always gated)."""
OWN_WIDTH = {"own_width": True}  # moe_intermediate_size says the experts' width, whatever d_ff is


def qwen_layout(name: str, names: dict[str, str], rules: dict[str, Any]) -> tuple[Any, ...]:
    return (moe_layout(name, expert_maps, lambda moe: moe_config(moe, names, {**OWN_WIDTH, **rules})),)


class QwenMoe:
    """What the two Qwen MoE families add to their dense family (a mixin before it)."""

    extends = Llama()
    experts_default: int
    top_k_default: int
    expert_ff_default: int
    moe_fields: frozenset[str]

    def moe(self, f: Fields) -> dict[str, Any]:
        return moe_component(
            f,
            experts="num_experts",
            aliases=("num_local_experts",),
            experts_default=self.experts_default,
            top_k_default=self.top_k_default,
            expert_ff=f.integer("moe_intermediate_size", self.expert_ff_default),
            normalize=f.flag("norm_topk_prob", False),
        )

    def dense_layers(self, f: Fields, n_layer: int) -> list[bool]:
        return [not sparse for sparse in sparse_layers(f, n_layer)]

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        return {**super().layer_config(recipe, values, reasons), **sparse_config(values)}  # type: ignore[misc]


class Qwen2Moe(QwenMoe, Qwen2):
    name = "qwen2_moe"
    model_type = "qwen2_moe"
    architecture = "Qwen2MoeForCausalLM"
    title = "Qwen2-MoE"
    layout = "qwen2_moe"
    component_layouts = qwen_layout("qwen2_moe", SHARED, {"shared_gate": True})
    per_layer = frozenset({*Qwen2.per_layer, MOE_LAYER})
    known = frozenset({*Qwen2.known, *SHARED.values()})
    required = {**Qwen2.required, "shared_expert_intermediate_size": "mlp"}
    kv_heads_default = 16
    experts_default, top_k_default, expert_ff_default = 60, 4, 1408

    def mlp(self, f: Fields) -> dict[str, Any]:
        shared = f.integer("shared_expert_intermediate_size", 5632)
        return {**self.moe(f), "shared_ff": shared, "shared_gate": True}

    def attention(self, f: Fields) -> dict[str, Any]:
        if not f.flag("qkv_bias", True):
            f.problems.append(
                "config.json qkv_bias=false is not supported (gptzoo reads Qwen2-MoE's biases on q, k and v; "
                "a model without them is a Qwen3-MoE)"
            )
        return super().attention(f)


class Qwen3Moe(QwenMoe, Qwen3):
    name = "qwen3_moe"
    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    title = "Qwen3-MoE"
    layout = "qwen3_moe"
    component_layouts = qwen_layout("qwen3_moe", NAMES, {})
    per_layer = frozenset({*Qwen3.per_layer, MOE_LAYER})
    known = frozenset({*Qwen3.known, *NAMES.values()})
    kv_heads_default = 4
    experts_default, top_k_default, expert_ff_default = 128, 8, 768

    def mlp(self, f: Fields) -> dict[str, Any]:
        return self.moe(f)

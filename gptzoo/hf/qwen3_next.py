"""Qwen3-Next checkpoints as Hugging Face stores them (Qwen3NextForCausalLM; Qwen Team, 2025): Qwen3.5's
hybrid (gptzoo.hf.qwen3_5: gated DeltaNet layers with a gated full-attention layer every
``full_attention_interval``, Gemma-style norms, partial RoPE) with Qwen2-MoE's mixture of experts
(gptzoo.hf.qwen_moe: a shared expert scaled by sigmoid(``shared_expert_gate``), experts on the layers not in
``mlp_only_layers`` whose index + 1 is a multiple of ``decoder_sparse_step``, the others a gated MLP of
intermediate_size).

What differs from Qwen3.5 is how a DeltaNet layer stores its projections: ``linear_attn.in_proj_qkvz`` holds,
for each of the linear_num_key_heads key heads in turn, that head's query and key rows, then the value and z
rows of the value heads it serves; ``linear_attn.in_proj_ba`` likewise holds each key head's b rows then its a
rows. gptzoo's in_proj keeps q, k, v and z one after another (and gate_proj b then a), so each is one grouped
map (gptzoo.hf.tensor_map.TensorMap ``groups``): the same table loads and exports.

In a recipe the layer types are Qwen3.5's, "linear" and "full", joined with "dense" or "moe" when some layers
have no experts (``linear_dense``, ``full_moe``).
"""

from __future__ import annotations

from typing import Any

from gptzoo.hf.family import Fields
from gptzoo.hf.layouts import builtin
from gptzoo.hf.moe import MOE_LAYER, moe_component, sparse_config, sparse_layers
from gptzoo.hf.qwen3_5 import Qwen3_5, deltanet_fields, deltanet_maps, grouped
from gptzoo.hf.qwen_moe import SHARED, qwen_layout
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe


def qwen3_next_maps(net: Any) -> list[TensorMap] | None:
    """Qwen3-Next's: q, k, v and z in one projection and b and a in another, each grouped by key head."""
    Hk, H, at = net.key_heads, net.heads, "linear_attn."
    qk, vz = Hk * net.key_dim, H * net.value_dim
    projections = grouped("in_proj.weight", f"{at}in_proj_qkvz.weight", (qk, qk, vz, vz), Hk)
    gates = grouped("gate_proj.weight", f"{at}in_proj_ba.weight", (H, H), Hk)
    return deltanet_maps(net, at, projections, gates, "out_proj")


LAYOUT = (
    builtin("gptzoo_plugins._gated_deltanet:GatedDeltaNet", "qwen3_next", qwen3_next_maps, deltanet_fields),
    *qwen_layout("qwen3_next", SHARED, {"shared_gate": True}),
)
"""The "qwen3_next" layout of the components it stores otherwise than Qwen3.5 (the rest: Qwen3.5's)."""


class Qwen3Next(Qwen3_5):
    name = "qwen3_next"
    model_type = "qwen3_next"
    architecture = "Qwen3NextForCausalLM"
    title = "Qwen3-Next"
    layout = "qwen3_next"
    extends = Qwen3_5()
    component_layouts = LAYOUT
    known = frozenset({*Qwen3_5.known, *SHARED.values()})
    required = {**Qwen3_5.required, "shared_expert_intermediate_size": "mlp"}
    per_layer = frozenset({*Qwen3_5.per_layer, MOE_LAYER})
    dropped = ("mtp.",)

    def mlp(self, f: Fields) -> dict[str, Any]:
        """The experts (Qwen3NextConfig's defaults), with a gated shared expert."""
        moe = moe_component(
            f,
            experts="num_experts",
            experts_default=512,
            top_k_default=10,
            expert_ff=f.integer("moe_intermediate_size", 512),
            normalize=f.flag("norm_topk_prob", True),
        )
        return {**moe, "shared_ff": f.integer("shared_expert_intermediate_size", 512), "shared_gate": True}

    def dense_layers(self, f: Fields, n_layer: int) -> list[bool]:
        return [not sparse for sparse in sparse_layers(f, n_layer)]

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        return {**super().layer_config(recipe, values, reasons), **sparse_config(values)}

"""Mixtral checkpoints as Hugging Face stores them (MixtralForCausalLM; Jiang et al., 2024).

Mistral's model (gptzoo.hf.mistral: keys, attention, RMSNorm, RoPE, a sliding window on every layer or
none; MixtralConfig's sliding_window defaults to null) with a mixture of experts in every layer: under
``model.layers.N.block_sparse_moe``, the router ``gate`` and expert e's ``experts.e.w1`` (gate), ``w3``
(up) and ``w2`` (down). The router takes the softmax of its logits, keeps the top num_experts_per_tok of
num_local_experts experts and always renormalizes their weights (gptzoo's ``moe`` with its defaults);
experts are intermediate_size wide. router_jitter_noise only perturbs training inputs in transformers
and is not read; router_aux_loss_coef is the training recipe's ``[train] aux_loss_weight``, not the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields
from gptzoo.hf.llama import Llama
from gptzoo.hf.mistral import Mistral
from gptzoo.hf.moe import MOE_LAYER, expert_maps, moe_component, moe_config, moe_layout

NAMES = {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "normalize": "norm_topk_prob"}
"""The routing features MixtralConfig has fields for (norm_topk_prob only as the implied true)."""

LAYOUT = (
    moe_layout(
        "mixtral",
        lambda moe: expert_maps(moe, projections=("w1", "w3", "w2")),
        lambda moe: moe_config(moe, NAMES),
    ),
)
"""The "mixtral" layout of the built-in components: the mixture of experts; the others are Llama's."""


class Mixtral(Mistral):
    name = "mixtral"
    model_type = "mixtral"
    architecture = "MixtralForCausalLM"
    title = "Mixtral"
    layout = "mixtral"
    extends = Llama()
    component_layouts = LAYOUT
    block_parts: Mapping[str, str] = {**Mistral.block_parts, "mlp": "block_sparse_moe"}
    per_layer = frozenset({"sliding_window", MOE_LAYER})
    known = frozenset({*Mistral.known, "num_local_experts", "num_experts_per_tok"})
    implied: Mapping[str, Any] = {"norm_topk_prob": True}
    """Every layer's mlp must say it renormalizes: a layer without experts has no place here."""
    window_default = None
    eps_default = 1e-5

    def mlp(self, f: Fields) -> dict[str, Any]:
        return moe_component(f, experts="num_local_experts", experts_default=8, top_k_default=2)

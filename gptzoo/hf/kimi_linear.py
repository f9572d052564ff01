"""Kimi Linear checkpoints as Hugging Face stores them (KimiLinearForCausalLM; Kimi Team, 2025): Kimi delta
attention layers between latent-attention layers without positions, DeepSeek-V3's mixture of experts after the
first layers.

Keys as Llama's where Llama has them (``model.embed_tokens``, ``model.layers.N.{input_layernorm,
post_attention_layernorm}``, ``model.norm``, ``lm_head``), and per layer, as ``layer_types`` says (or
``linear_attn_config``'s 1-indexed ``kda_layers`` and ``full_attn_layers``, as the released config.json files
say; by default every fourth layer but the first attends):

- "full_attention": DeepSeek's latent attention under ``self_attn`` (gptzoo.hf.deepseek), with no rotation at all
  (NoPE: the rotary part of the keys is shared but never rotated); its latent norms use 1e-6 whatever
  rms_norm_eps says (the mla's ``latent_eps``);
- "linear_attention": gptzoo's ``kda`` under ``self_attn``: ``q_proj``, ``k_proj`` and ``v_proj`` one after
  another are its in_proj, ``q/k/v_conv1d`` its convolution, ``f_a_proj``, ``f_b_proj``, ``dt_bias`` and ``A_log``
  its forget gate, ``b_proj``, ``g_a_proj``, ``g_b_proj``, ``o_norm`` and ``o_proj`` the rest (``linear_num_heads``
  heads of ``linear_head_dim``, ``linear_conv_kernel_dim`` taps).

The MLP is a gated MLP of intermediate_size under ``mlp`` on the layers ``mlp_layer_types`` calls "dense" (or the
first ``first_k_dense_replace``), else DeepSeek-V3's experts under ``block_sparse_moe`` (``gate`` with its
``e_score_correction_bias``, expert e's ``experts.e.{w1, w3, w2}`` (gate, up, down), ``shared_experts``). The
released config.json files name several fields otherwise (``num_experts``, ``num_experts_per_token``,
``num_shared_experts``, ``moe_renormalize``, ``num_expert_group``, ``model_max_length``); both names are read.
transformers' save_pretrained writes a dense layer's MLP under ``block_sparse_moe`` too; it is read there as well.

In a recipe the layer types are Qwen3-Next's: "linear" and "full", joined with "dense" or "moe".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from gptzoo.hf.deepseek import MLA, V3_NAMES, DeepseekV3, mla_maps, moe_fields, v3_groups
from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import ACTIVATIONS, Llama, gated_mlp_maps, plain_embeddings_and_logits
from gptzoo.hf.moe import MOE_LAYER, expert_maps, moe_layout
from gptzoo.hf.qwen3_5 import FULL, LAYER_TYPE, LINEAR, hybrid_schedule, joined
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe

LATENT_EPS = 1e-6
"""The epsilon of Kimi Linear's latent norms, whatever rms_norm_eps says."""
ALIASES = {
    "max_position_embeddings": "model_max_length",
    "norm_topk_prob": "moe_renormalize",
    "n_group": "num_expert_group",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
}
"""KimiLinearConfig's attribute_map: its field -> the name the released config.json files use."""
KDA_FIELDS = {"heads": "linear_num_heads", "head_size": "linear_head_dim", "kernel": "linear_conv_kernel_dim"}
"""kda's parameters -> config.json's fields."""
NAMES = {**V3_NAMES, "experts": "num_local_experts"}
"""The routing features KimiLinearConfig has fields for."""
DENSE_MLP = re.compile(r"(layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.)")
"""A dense layer's MLP as transformers' save_pretrained names it."""


def kda_maps(net: Any) -> list[TensorMap] | None:
    """Kimi delta attention under ``self_attn`` (the block's attention part); None with biases (Kimi's have none)."""
    if net.in_proj.bias is not None or net.c_proj.bias is not None:
        return None
    width = net.heads * net.head_size
    qkv = (("q_proj", width), ("k_proj", width), ("v_proj", width))
    maps = [joined("in_proj.weight", "", qkv)]
    maps.append(joined("conv.weight", "", (("q_conv1d", width), ("k_conv1d", width), ("v_conv1d", width))))
    maps += [
        TensorMap(f"{p}.weight", (f"{p}.weight",)) for p in ("f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj")
    ]
    maps += [TensorMap(p, (p,)) for p in ("A_log", "dt_bias")]
    maps.append(TensorMap("norm.weight", ("o_norm.weight",)))
    return [*maps, TensorMap("c_proj.weight", ("o_proj.weight",))]


def kda_fields(net: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {field: getattr(net, param) for param, field in KDA_FIELDS.items()}
    return {**fields, LAYER_TYPE: LINEAR, "rms_norm_eps": net.norm.eps}


def latent_fields(attn: Any) -> dict[str, Any]:
    """The latent attention's fields; a softmax scale or latent norms Kimi Linear lacks under names it has no field
    for."""
    fields: dict[str, Any] = {
        "kv_lora_rank": attn.kv_rank,
        "q_lora_rank": attn.q_rank or None,
        "qk_nope_head_dim": attn.nope_dim,
        "qk_rope_head_dim": attn.rope_dim,
        "v_head_dim": attn.v_dim,
        LAYER_TYPE: FULL,
    }
    if abs(attn.scale - (attn.nope_dim + attn.rope_dim) ** -0.5) > 1e-12:
        fields["mla_scale"] = attn.scale
    norms = [attn.kv_norm, *([attn.q_norm] if attn.q_rank else [])]
    if any(getattr(norm, "eps", None) != LATENT_EPS for norm in norms):
        fields["latent_norm_eps"] = getattr(attn.kv_norm, "eps", None)
    return fields


def moe_maps(moe: Any) -> list[TensorMap]:
    """DeepSeek-V3's experts under ``block_sparse_moe``: w1, w3 and w2 each expert's gate, up and down projections,
    the shared experts' named as Llama's."""
    routed = [m for m in expert_maps(moe, projections=("w1", "w3", "w2")) if not m.ours.startswith("shared.")]
    shared = [m for m in expert_maps(moe, shared="shared_experts") if m.ours.startswith("shared.")]
    return under("block_sparse_moe.", routed + shared)


def under(prefix: str, maps: list[TensorMap]) -> list[TensorMap]:
    """The maps with their tensors under ``prefix``."""
    return [dataclasses.replace(m, theirs=tuple(prefix + t for t in m.theirs)) for m in maps]


LAYOUT = (
    builtin(
        MLA,
        "kimi_linear",
        mla_maps,
        latent_fields,
        children=(("q_norm", "q_a_layernorm"), ("kv_norm", "kv_a_layernorm")),
    ),
    builtin("gptzoo_plugins._kda:KimiDeltaAttention", "kimi_linear", kda_maps, kda_fields),
    builtin("gptzoo_plugins._attentions:CausalSelfAttention", "kimi_linear", lambda attn: None),
    builtin("gptzoo_plugins._mlps:GatedMLP", "kimi_linear", lambda mlp: under("mlp.", gated_mlp_maps(mlp))),
    builtin("gptzoo_plugins._positions:NoPosition", "kimi_linear", lambda position: [], lambda position: {}),
    moe_layout("kimi_linear", moe_maps, lambda moe: moe_fields(moe, NAMES, v3_groups)),
)
"""The "kimi_linear" layout of the built-in components it stores otherwise than Llama."""


class KimiLinear(DeepseekV3):
    name = "kimi_linear"
    model_type = "kimi_linear"
    architecture = "KimiLinearForCausalLM"
    title = "Kimi Linear"
    layout = "kimi_linear"
    extends = Llama()
    component_layouts = LAYOUT
    required = {"rms_norm_eps": "norm", "hidden_act": "activation", "kv_lora_rank": "attention"}
    known = frozenset({*DeepseekV3.mla_known, *NAMES.values(), *DeepseekV3.moe_known, *KDA_FIELDS.values()})
    implied: Mapping[str, Any] = {}
    per_layer = frozenset({LAYER_TYPE, MOE_LAYER})
    block_parts: Mapping[str, str] = {
        "ln_1": "input_layernorm",
        "attn": "self_attn",
        "ln_2": "post_attention_layernorm",
        "mlp": "",
    }
    defaults = {"experts": 256, "expert_ff": 1024, "shared": 1, "dense": 1, "context": 1048576, "scale": 2.446}

    @property
    def size_defaults(self) -> Mapping[str, Any]:  # type: ignore[override]
        """KimiLinearConfig's defaults of the sizes a config.json may omit."""
        return {
            "vocab_size": 163840,
            "n_embd": 2304,
            "n_head": 32,
            "n_layer": 27,
            "d_ff": 9216,
            "context_length": self.defaults["context"],
        }

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        config = {**{field: config[alias] for field, alias in ALIASES.items() if alias in config}, **config}
        linear = config.get("linear_attn_config")
        linear = linear if isinstance(linear, dict) else {}
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_head, n_layer = sizes["n_head"], sizes["n_layer"]
        eps = f.number("rms_norm_eps", 1e-5)
        attention: dict[str, Any] = {
            "name": "mla",
            "kv_rank": f.integer("kv_lora_rank", 512),
            "nope_dim": f.integer("qk_nope_head_dim", 128),
            "v_dim": f.integer("v_head_dim", 128),
        }
        if config.get("q_lora_rank") is not None:
            attention["q_rank"] = f.integer("q_lora_rank")
        if eps != LATENT_EPS:
            attention["latent_eps"] = LATENT_EPS
        if sizes["n_kv_head"] != n_head:
            f.problems.append(
                f"config.json num_key_value_heads={sizes['n_kv_head']} is not supported: {self.title}'s latent "
                f"attention expands its latent into keys and values for every one of the num_attention_heads={n_head} "
                "heads"
            )
        kda = {
            "name": "kda",
            "heads": f.integer("linear_num_heads", linear.get("num_heads", 32)),
            "head_size": f.integer("linear_head_dim", linear.get("head_dim", 128)),
            "kernel": f.integer("linear_conv_kernel_dim", linear.get("short_conv_kernel_size", 4)),
            "norm_eps": eps,
        }
        model: dict[str, Any] = {
            **sizes,
            "n_kv_head": n_head,
            "head_dim": f.integer("qk_rope_head_dim", 64),
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": eps},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": self.moe(f),
            "position": "none",
            "attention": attention,
        }
        types = self.layer_types(f, linear, n_layer)
        model.update(hybrid_schedule(types, self.dense_layers(f, n_layer), kda))
        for field in ("attention_bias", "mlp_bias"):
            if f.flag(field, False):
                f.problems.append(
                    f"config.json {field}=true is not supported ({self.title}'s checkpoints have no biases)"
                )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def moe_rules(self, f: Fields) -> dict[str, Any]:
        """V3's routing, with KimiLinearConfig's default of one group."""
        rules = {"scoring": "sigmoid", "score_bias": True, "normalize": f.flag("norm_topk_prob", True)}
        return {**rules, "group_score": "top2"} if f.integer("n_group", 1) > 1 else rules

    def layer_types(self, f: Fields, linear: Mapping[str, Any], n_layer: int) -> list[str]:  # type: ignore[override]
        """layer_types, else linear_attn_config's 1-indexed kda_layers and full_attn_layers, else every fourth layer
        but the first attends (KimiLinearConfig's default)."""

        def default() -> list[str]:
            full, kda = linear.get("full_attn_layers"), linear.get("kda_layers")
            if isinstance(full, list) and isinstance(kda, list):
                types = [LINEAR if i + 1 in kda else FULL if i + 1 in full else None for i in range(n_layer)]
                if None not in types:
                    return types  # type: ignore[return-value]
                f.problems.append(
                    f"config.json linear_attn_config kda_layers={show(kda)} and full_attn_layers={show(full)} do not "
                    f"name each of layers 1 to {n_layer} once"
                )
            return [FULL if i and i % 4 == 0 else LINEAR for i in range(n_layer)]

        return f.layer_types(n_layer, (LINEAR, FULL), default)

    def dense_layers(self, f: Fields, n_layer: int) -> list[bool]:
        """mlp_layer_types ("dense" or "sparse"), else the first first_k_dense_replace layers (default 1)."""
        kinds_ = f.config.get("mlp_layer_types")
        if kinds_ is None:
            first = f.config.get("first_k_dense_replace", self.defaults["dense"])
            if type(first) is not int or first < 0:
                f.problems.append(f"config.json first_k_dense_replace={show(first)} is not an integer >= 0")
                first = 0
            return [i < first for i in range(n_layer)]
        if not isinstance(kinds_, list) or len(kinds_) != n_layer or not set(kinds_) <= {"dense", "sparse"}:
            f.problems.append(
                f"config.json mlp_layer_types={show(kinds_)} is not a list of {n_layer} 'dense' or 'sparse'"
            )
            return [False] * n_layer
        return [kind == "dense" for kind in kinds_]

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        tensors = {DENSE_MLP.sub(r"\1mlp.\2", key): value for key, value in tensors.items()}
        return super().normalize(tensors, model, source)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "pre":
            reasons.append(f"norm_placement {m.norm_placement!r} ({self.title} is Pre-LN)")
        if m.bias:
            reasons.append(f"bias=true ({self.title} has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        # KimiLinearConfig's default pad_token_id, 163839, is no token of a smaller vocabulary
        return {**self.write_sizes(recipe), "attention_bias": False, "pad_token_id": None}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        sparse = ["sparse" if s else "dense" for s in values[MOE_LAYER]]
        return {"layer_types": values[LAYER_TYPE], "mlp_layer_types": sparse}

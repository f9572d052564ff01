"""gpt-oss checkpoints as Hugging Face stores them (GptOssForCausalLM; OpenAI, 2025, gpt-oss-120b & gpt-oss-20b
model card; transformers 5's models/gpt_oss/modeling_gpt_oss.py is the reference).

Llama's keys and Pre-LN block (gptzoo.hf.llama) with:

- attention biases on q, k, v and o iff attention_bias (default true), and attention sinks in every layer
  (``self_attn.sinks``, one logit per head: gptzoo's attention ``sinks = true``);
- ``layer_types``: "sliding_attention" layers see their last ``sliding_window`` keys, "full_attention"
  layers every key (default: sliding and full alternating, sliding first); in a recipe the layer types
  "sliding" and "full" (gptzoo.hf.mistral's schedule);
- RMSNorms that multiply by their weight in float32 before casting back (rmsnorm ``scale_in_float32``);
- one RoPE for every layer, YaRN by default (``rope_parameters`` in transformers 5, ``rope_theta`` and
  ``rope_scaling`` before; GptOssConfig's defaults: theta 150000, factor 32 over 4096 positions, no
  truncation);
- a mixture of experts in every layer, under ``mlp``: the router ``router.{weight,bias}`` takes the top
  num_experts_per_tok of num_local_experts logits and the softmax over those (gptzoo's ``moe`` with
  ``scoring = "topk_softmax"``, ``router_bias``); the experts, intermediate_size wide and biased
  (``expert_bias``), stored as four stacked tensors per layer: ``experts.gate_up_proj`` (E, d, 2 ff),
  [in, out] with gate and up columns alternating, ``gate_up_proj_bias`` (E, 2 ff) alike,
  ``experts.down_proj`` (E, ff, d) and ``down_proj_bias`` (E, d) (TensorMap's ``stack``). Their
  activation is the clamped SwiGLU (up.clamp(-limit, limit) + 1) * g sigmoid(alpha g), g =
  gate.clamp(max=limit): the experts' ``glu_limit`` = swiglu_limit, and the activation quick_gelu for
  swiglu_alpha 1.702 (silu for 1.0; other alphas are refused). hidden_act is not read (the experts do
  not use it); router_aux_loss_coef is the training recipe's ``[train] aux_loss_weight``.

Quantized checkpoints (the official ones are MXFP4: quantization_config) are refused by name; a
dequantized copy loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.gemma import FULL, SLIDING, one_value
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import (
    Llama,
    attention_fields,
    attention_maps,
    rope_fields,
    rope_layouts,
    rope_position,
)
from gptzoo.hf.mistral import schedule
from gptzoo.hf.moe import MOE_LAYER, every_layer_sparse, expert_maps, moe_component, moe_config, moe_layout
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe

NAMES = {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "glu_limit": "swiglu_limit"}
"""The routing features GptOssConfig has fields for."""
RULES = {"scoring": "topk_softmax", "normalize": False, "router_bias": True, "expert_bias": True}
"""What gpt-oss's router and experts always are."""
ALPHAS = {1.702: "quick_gelu", 1.0: "silu"}
"""swiglu_alpha -> the activation x sigmoid(alpha x) is."""
YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
"""GptOssConfig's rope scaling when config.json gives none."""
THETA = 150000.0


def stacked_expert_maps(moe: Any) -> list[TensorMap]:
    """Each expert's c_fc and c_proj as its slice of the layer's stacked tensors ([in, out], gate and up
    columns alternating), beside the router (and what gpt-oss has no place for, mapped as the other MoE
    families map it, for its config to refuse by name)."""
    maps = [m for m in expert_maps(moe, router="router") if not m.ours.startswith("experts.")]
    n = len(moe.experts)
    for e, expert in enumerate(moe.experts):
        ff = expert.c_proj.in_features
        fc = {"parts": (ff, ff), "groups": ff} if expert.gated else {}
        maps += [
            TensorMap(f"experts.{e}.c_fc.weight", ("experts.gate_up_proj",), transpose=True, stack=n, index=e, **fc),
            TensorMap(f"experts.{e}.c_proj.weight", ("experts.down_proj",), transpose=True, stack=n, index=e),
        ]
        if expert.c_fc.bias is not None:
            maps.append(TensorMap(f"experts.{e}.c_fc.bias", ("experts.gate_up_proj_bias",), stack=n, index=e, **fc))
        if expert.c_proj.bias is not None:
            maps.append(TensorMap(f"experts.{e}.c_proj.bias", ("experts.down_proj_bias",), stack=n, index=e))
    return maps


def moe_fields(moe: Any) -> dict[str, Any]:
    fields = moe_config(moe, NAMES, RULES)
    if not fields["swiglu_limit"]:  # gpt-oss always clamps: an unclamped GLU is refused by its own name
        del fields["swiglu_limit"]
        fields["glu_limit"] = 0.0
    return fields


def rope_parameters(rope_type: str) -> Any:
    """A rope position's fields as transformers 5's rope_parameters (GptOssConfig would otherwise take
    its own YaRN for a config without them)."""
    plain = rope_fields("rope_theta", "partial_rotary_factor")(rope_type)

    def config(position: Any) -> dict[str, Any]:
        fields = plain(position)
        scaling = fields.pop("rope_scaling", {"rope_type": "default"})
        return {"rope_parameters": {**scaling, "rope_theta": fields.pop("rope_theta")}, **fields}

    return config


ATTENTION = "gptzoo_plugins._attentions:CausalSelfAttention"
LAYOUT = (
    moe_layout("gpt_oss", stacked_expert_maps, moe_fields),
    builtin(ATTENTION, "gpt_oss", attention_maps, attention_fields, children=("q_norm", "k_norm")),
    *rope_layouts("gpt_oss", rope_parameters),
    *(
        builtin(
            f"gptzoo_plugins._activations:{cls}", "gpt_oss", lambda act: [], lambda act, a=alpha: {"swiglu_alpha": a}
        )
        for cls, alpha in (("QuickGELU", 1.702), ("SiLU", 1.0))
    ),
)
"""The "gpt_oss" layout of the built-in components; the others are Llama's (the norms)."""


class GptOss(Llama):
    name = "gpt_oss"
    model_type = "gpt_oss"
    architecture = "GptOssForCausalLM"
    title = "gpt-oss"
    layout = "gpt_oss"
    extends = Llama()
    component_layouts = LAYOUT
    required = {"rms_norm_eps": "norm", "swiglu_alpha": "activation", "rope_parameters": "position"}
    known = frozenset({*NAMES.values()})
    size_defaults = {
        "vocab_size": 201088,
        "n_embd": 2880,
        "n_head": 64,
        "n_layer": 36,
        "d_ff": 2880,
        "context_length": 131072,
    }
    implied: Mapping[str, Any] = {"rms_norm_scale_in_float32": True, "sinks": True}
    per_layer = frozenset({"sliding_window", MOE_LAYER})

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, n_layer = sizes["n_embd"], sizes["n_head"], sizes["n_layer"]
        head_dim = f.integer("head_dim", 64)
        limit = f.number("swiglu_limit", 7.0)
        if limit <= 0:
            f.problems.append(f"config.json swiglu_limit={show(config['swiglu_limit'])} is not a positive clamp")
        alpha = f.number("swiglu_alpha", 1.702)
        if alpha not in ALPHAS:
            f.problems.append(
                f"config.json swiglu_alpha={show(alpha)} is not supported (gptzoo implements 1.702, the activation "
                "quick_gelu, and 1.0, silu)"
            )
        model: dict[str, Any] = {
            **sizes,
            **({"head_dim": head_dim} if head_dim * n_head != n_embd else {}),
            "bias": f.flag("attention_bias", True),
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-5), "scale_in_float32": True},
            "norm_placement": "pre",
            "activation": ALPHAS.get(alpha, "quick_gelu"),
            "mlp": moe_component(
                f,
                experts="num_local_experts",
                aliases=("num_experts",),
                experts_default=128,
                top_k_default=4,
                scoring="topk_softmax",
                normalize=False,
                router_bias=True,
                expert_bias=True,
                glu_limit=limit,
            ),
            "position": self.position(f, sizes["context_length"]),
            "attention": {"name": "causal", "sinks": True},
        }
        model.update(schedule(model, self.layer_windows(f, n_layer), [False] * n_layer))
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    @staticmethod
    def position(f: Fields, context_length: int) -> dict[str, Any]:
        """The RoPE of config.json's rope_parameters or rope_scaling, else GptOssConfig's YaRN."""
        parameters = dict(f.mapping("rope_parameters"))
        scaling = f.mapping("rope_scaling") or parameters or YARN
        if "rope_theta" not in parameters and "rope_theta" not in f.config:
            parameters["rope_theta"] = THETA
        return rope_position(f, context_length, parameters=parameters, scaling=scaling)

    @staticmethod
    def layer_windows(f: Fields, n_layer: int) -> list[int | None]:
        """Each layer's window (None: full attention) from layer_types (default: sliding, full, sliding, ...)."""
        types = f.config.get("layer_types")
        if types is None:
            types = [SLIDING if i % 2 == 0 else FULL for i in range(n_layer)]
        elif not isinstance(types, list) or len(types) != n_layer or not all(t in (SLIDING, FULL) for t in types):
            f.problems.append(
                f"config.json layer_types={show(types)} is not a list of num_hidden_layers={n_layer} {SLIDING!r} or "
                f"{FULL!r} entries"
            )
            types = [FULL] * n_layer
        if SLIDING not in types:
            return [None] * n_layer
        if "sliding_window" in f.config and f.config["sliding_window"] is None:
            f.problems.append(
                "config.json sliding_window=None, but layer_types has sliding_attention layers; give the window "
                "(a number of keys) or make every layer full_attention"
            )
        window = f.integer("sliding_window", 128)
        return [window if t == SLIDING else None for t in types]

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return {**self.write_sizes(recipe), "head_dim": recipe.model.head_dim, "attention_bias": recipe.model.bias}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        every_layer_sparse(values, self.title, reasons)
        windows = values["sliding_window"]
        window = one_value([w for w in windows if w is not None], "sliding_window", reasons)
        return {"layer_types": [FULL if w is None else SLIDING for w in windows], "sliding_window": window}

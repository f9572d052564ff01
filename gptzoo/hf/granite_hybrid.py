"""Granite 4.0-H checkpoints as Hugging Face stores them (GraniteMoeHybridForCausalLM, model_type
``granitemoehybrid``; IBM, 2025): Mamba-2 layers with a few attention layers, each followed by a gated MLP and,
in the MoE sizes, experts beside it.

Keys as Llama's where Llama has them (``model.embed_tokens``, ``model.layers.N.{input_layernorm,
post_attention_layernorm}``, ``model.norm``, ``lm_head`` unless tied), and per layer, as ``layer_types`` says
("mamba" or "attention"; transformers 5 also writes "linear_attention" and "full_attention"; by default every
layer is Mamba-2):

- "attention": ``self_attn.{q,k,v,o}_proj``, queries scaled by ``attention_multiplier`` (the attention's
  ``scale``), RoPE of ``rope_theta`` when ``position_embedding_type`` is "rope", else no positions at all
  (the released checkpoints: NoPE);
- "mamba": ``mamba.{in_proj, conv1d, A_log, D, dt_bias, norm, out_proj}``, gptzoo's ``mamba2`` (in_proj's rows
  z, x, B, C, dt as ours; ``mamba_n_heads`` heads of ``mamba_d_head`` channels, ``mamba_expand`` times the
  width in all; ``mamba_n_groups`` groups of ``mamba_d_state``; ``mamba_d_conv`` taps, ``mamba_conv_bias``).

The MLP is ``shared_mlp.{input_linear, output_linear}``, a gated MLP of ``shared_intermediate_size`` (the
recipe's d_ff) whose input_linear holds the gate's rows then the up projection's, as gptzoo's c_fc. With
``num_local_experts`` > 0 the layer adds ``block_sparse_moe``: a router (``router.layer``) whose top
``num_experts_per_tok`` logits are softmaxed (scoring "topk_softmax"), experts of ``intermediate_size``
stored as two stacked tensors (``input_linear`` (E, 2 ff, d), ``output_linear`` (E, d, ff)); gptzoo's ``moe``
with the shared MLP as its ungated shared expert. Granite's multipliers are the recipe's
``embedding_multiplier``, ``residual_multiplier`` and ``logits_scaling``.

In a recipe the layer types are ``mamba`` and ``full``: [model] holds the attention layers' components and
``[model.layer_types.mamba]`` the Mamba-2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import SIZES, Fields, Size, refuse, show
from gptzoo.hf.gemma import shortest_period
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import (
    ACTIVATIONS,
    ROPE_TYPES,
    Llama,
    attention_fields,
    attention_maps,
    kinds,
    odd_head_dim,
    plain_embeddings_and_logits,
    rope_fields,
    rope_position,
)
from gptzoo.hf.moe import MOE_LAYER, moe_component, moe_config, moe_layout
from gptzoo.hf.qwen3_5 import FULL, LAYER_TYPE, LINEAR
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe
from gptzoo.recipe.schema import MULTIPLIERS

LEGACY = {"mamba": LINEAR, "attention": FULL}
"""The layer type names Granite's config.json files use -> transformers 5's."""
MAMBA_FIELDS = {
    "heads": "mamba_n_heads",
    "value_dim": "mamba_d_head",
    "state": "mamba_d_state",
    "groups": "mamba_n_groups",
    "kernel": "mamba_d_conv",
}
"""mamba2's parameters -> config.json's fields."""
MOE_NAMES = {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "expert_ff": "intermediate_size"}
"""The routing features Granite has fields for."""
TIME_STEP_LIMIT = [0.0, float("inf")]
"""The time step clamp gptzoo's Mamba-2 has (none)."""


def _number(value: Any) -> Any:
    """A number of config.json; transformers writes infinity as {"__float__": "Infinity"}."""
    if isinstance(value, dict) and isinstance(value.get("__float__"), str):
        return float(value["__float__"])
    return value


def mamba_maps(net: Any) -> list[TensorMap]:
    """The Mamba-2 under ``mamba.``: in_proj, conv1d, A_log, D, dt_bias, norm and out_proj."""
    at = "mamba."
    maps = [TensorMap(f"in_proj.{k}", (f"{at}in_proj.{k}",)) for k in kinds(net.in_proj)]
    maps += [TensorMap(f"conv.{k}", (f"{at}conv1d.{k}",)) for k in kinds(net.conv)]
    maps += [TensorMap(p, (f"{at}{p}",)) for p in ("A_log", "D", "dt_bias")]
    maps.append(TensorMap("norm.weight", (f"{at}norm.weight",)))
    return maps + [TensorMap(f"c_proj.{k}", (f"{at}out_proj.{k}",)) for k in kinds(net.c_proj)]


def mamba_fields(net: Any) -> dict[str, Any]:
    """The Mamba-2's config.json fields; an inner width that is no whole multiple of the model's under a name
    Granite lacks (mamba_expand is an integer)."""
    fields: dict[str, Any] = {field: getattr(net, param) for param, field in MAMBA_FIELDS.items()}
    d_model = net.in_proj.in_features
    expand = {"mamba_expand": net.inner // d_model} if net.inner % d_model == 0 else {"mamba_inner": net.inner}
    fields.update(expand, mamba_conv_bias=net.conv.bias is not None, rms_norm_eps=net.norm.eps)
    return {**fields, LAYER_TYPE: LINEAR}


def shared_mlp_maps(mlp: Any) -> list[TensorMap] | None:
    """A gated MLP as ``shared_mlp``: c_fc ([gate; up]) is input_linear, c_proj output_linear; None with biases
    (Granite's have none)."""
    if mlp.c_fc.bias is not None or mlp.c_proj.bias is not None:
        return None
    return [
        TensorMap("c_fc.weight", ("shared_mlp.input_linear.weight",)),
        TensorMap("c_proj.weight", ("shared_mlp.output_linear.weight",)),
    ]


def expert_maps(moe: Any) -> list[TensorMap] | None:
    """The router, each expert as its slice of the stacked input_linear and output_linear, and the shared expert
    as shared_mlp; None with biases or without the shared expert's place (Granite's have none)."""
    shared = shared_mlp_maps(moe.shared) if moe.shared is not None else []
    if shared is None or moe.router.bias is not None or moe.experts[0].c_fc.bias is not None:
        return None
    at, n = "block_sparse_moe.", len(moe.experts)
    maps = [TensorMap("router.weight", (f"{at}router.layer.weight",))]
    for e in range(n):
        maps.append(TensorMap(f"experts.{e}.c_fc.weight", (f"{at}input_linear.weight",), stack=n, index=e))
        maps.append(TensorMap(f"experts.{e}.c_proj.weight", (f"{at}output_linear.weight",), stack=n, index=e))
    return maps + [TensorMap(f"shared.{m.ours}", m.theirs) for m in shared]


def moe_fields(moe: Any) -> dict[str, Any]:
    """The experts' fields; the shared expert must be the model's d_ff wide and ungated (Granite's shared_mlp)."""
    rules = {"scoring": "topk_softmax", "normalize": False, "own_width": moe.expert_ff != moe.d_ff}
    return moe_config(moe, MOE_NAMES, {**rules, "shared_ff": moe.d_ff})


def attention_config(attn: Any) -> dict[str, Any]:
    """The attention's fields, its scale as attention_multiplier (always written: Granite's default is 1)."""
    fields = {k: v for k, v in attention_fields(attn).items() if k != "query_pre_attn_scalar"}
    return {**fields, LAYER_TYPE: FULL, "attention_multiplier": attn.scale}


def _rope(rope_type: str) -> Any:
    fields = rope_fields("rope_theta", "partial_rotary_factor")(rope_type)
    return lambda position: {**fields(position), "position_embedding_type": "rope"}


LAYOUT = (
    builtin(
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "granitemoehybrid",
        lambda attn: attention_maps(attn, at="self_attn."),
        attention_config,
    ),
    builtin("gptzoo_plugins._mamba2:Mamba2", "granitemoehybrid", mamba_maps, mamba_fields),
    builtin("gptzoo_plugins._mlps:GatedMLP", "granitemoehybrid", shared_mlp_maps, lambda mlp: {"num_local_experts": 0}),
    moe_layout("granitemoehybrid", expert_maps, moe_fields),
    *(builtin(t.component, "granitemoehybrid", lambda position: [], _rope(name)) for name, t in ROPE_TYPES.items()),
    builtin(
        "gptzoo_plugins._positions:NoPosition",
        "granitemoehybrid",
        lambda position: [],
        lambda position: {"position_embedding_type": "nope", "rope_theta": None},
    ),
)
"""The "granitemoehybrid" layout of the components it stores otherwise than Llama (norms and activations: as
Llama)."""


class GraniteHybrid(Llama):
    name = "granitemoehybrid"
    model_type = "granitemoehybrid"
    architecture = "GraniteMoeHybridForCausalLM"
    title = "Granite 4.0-H"
    layout = "granitemoehybrid"
    extends = Llama()
    component_layouts = LAYOUT
    sizes = tuple(Size(s.ours, "shared_intermediate_size", 1024) if s.ours == "d_ff" else s for s in SIZES)
    size_defaults = {"context_length": 2048}
    known = frozenset({*MAMBA_FIELDS.values(), *MOE_NAMES.values(), "mamba_expand", "mamba_conv_bias"})
    known |= {"attention_multiplier", "position_embedding_type", "num_local_experts"}
    per_layer = frozenset({LAYER_TYPE, MOE_LAYER})
    multipliers = frozenset(MULTIPLIERS)
    block_parts: Mapping[str, str] = {
        "ln_1": "input_layernorm",
        "attn": "",
        "ln_2": "post_attention_layernorm",
        "mlp": "",
    }

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, n_layer = sizes["n_embd"], sizes["n_head"], sizes["n_layer"]
        head_dim = n_embd // n_head if n_head else 0
        eps = f.number("rms_norm_eps", 1e-6)
        kind = config.get("position_embedding_type")
        if kind not in (None, "rope", "nope"):
            f.problems.append(f"config.json position_embedding_type={show(kind)} is not 'rope', 'nope' or null")
        model: dict[str, Any] = {
            **sizes,
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": eps},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": self.mlp(f),
            "position": rope_position(f, sizes["context_length"]) if kind == "rope" else "none",
            "attention": {"name": "causal", "scale": f.number("attention_multiplier", 1.0)},
            **{key: f.number(key, 1.0) for key in MULTIPLIERS},
        }
        if head_dim * n_head != n_embd and n_head:
            f.problems.append(f"config.json hidden_size={n_embd} is not a multiple of num_attention_heads={n_head}")
        types = self.layer_types(f, n_layer)
        if LINEAR in types:
            pattern = ["mamba" if t == LINEAR else "full" for t in shortest_period(types)]
            layer_types = {
                "mamba": {"attention": self.mamba(f, n_embd, eps)},
                **({"full": {}} if FULL in types else {}),
            }
            model.update(layer_pattern=pattern, layer_types=layer_types)
        for key in ("attention_bias", "mamba_proj_bias"):
            if config.get(key):
                f.problems.append(
                    f"config.json {key}={show(config[key])} is not supported (gptzoo's Granite has no biases)"
                )
        limit = config.get("time_step_limit")
        if limit is not None and (not isinstance(limit, list) or [_number(x) for x in limit] != TIME_STEP_LIMIT):
            f.problems.append(
                f"config.json time_step_limit={show(limit)} is not supported (gptzoo's Mamba-2 does not clamp its "
                "time step: [0.0, inf])"
            )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def mlp(self, f: Fields) -> str | dict[str, Any]:
        """The gated MLP, or the experts with it as their shared expert (num_local_experts > 0; default 8)."""
        if f.config.get("num_local_experts", 8) == 0:
            return "gated"
        moe = moe_component(f, experts="num_local_experts", experts_default=8, top_k_default=2)
        width = f.integer("intermediate_size", 11008)
        shared = f.integer("shared_intermediate_size", 1024)
        return {**moe, "expert_ff": width, "scoring": "topk_softmax", "normalize": False, "shared_ff": shared}

    @staticmethod
    def mamba(f: Fields, n_embd: int, eps: float) -> dict[str, Any]:
        """The mamba2 component of the Mamba-2 layers (GraniteMoeHybridConfig's defaults)."""
        heads, expand = f.integer("mamba_n_heads", 128), f.integer("mamba_expand", 2)
        auto = f.config.get("mamba_d_head", "auto") in ("auto", None)
        value_dim = (expand * n_embd) // heads if auto else f.integer("mamba_d_head")
        if heads * value_dim != expand * n_embd:
            f.problems.append(
                f"config.json mamba_n_heads={heads} x mamba_d_head={value_dim} is not mamba_expand={expand} x "
                f"hidden_size={n_embd}"
            )
        groups = f.integer("mamba_n_groups", 1)
        if heads % groups:
            f.problems.append(f"config.json mamba_n_heads={heads} is not a multiple of mamba_n_groups={groups}")
        return {
            "name": "mamba2",
            "heads": heads,
            "value_dim": value_dim,
            "state": f.integer("mamba_d_state", 256),
            "groups": groups,
            "kernel": f.integer("mamba_d_conv", 4),
            "conv_bias": f.flag("mamba_conv_bias", True),
            "norm_eps": eps,
        }

    def layer_types(self, f: Fields, n_layer: int) -> list[str]:  # type: ignore[override]
        """config.json's layer_types (legacy names read as transformers 5 reads them), else all Mamba-2."""
        types = f.config.get("layer_types")
        if isinstance(types, list):
            f = Fields({**f.config, "layer_types": [LEGACY.get(t, t) if isinstance(t, str) else t for t in types]})
        found = f.layer_types(n_layer, (LINEAR, FULL), lambda: [LINEAR] * n_layer)
        return found

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m = recipe.model
        reasons = [] if m.norm_placement == "pre" else [f"norm_placement {m.norm_placement!r} (Granite is Pre-LN)"]
        if m.bias:
            reasons.append("bias=true (gptzoo's Granite has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        fields = {**self.write_sizes(recipe), **odd_head_dim(recipe), "attention_bias": False}
        return {**fields, "mamba_proj_bias": False, **{key: getattr(m, key) for key in MULTIPLIERS}}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        types = values[LAYER_TYPE]
        legacy = {new: old for old, new in LEGACY.items()}
        sparse = values[MOE_LAYER]
        if any(sparse) and not all(sparse):
            reasons.append("experts on some layers only (Granite 4.0-H has them in every layer or none)")
        return {"layer_types": [legacy.get(t, t) for t in types]}

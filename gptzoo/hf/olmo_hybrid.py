"""OLMo Hybrid checkpoints as Hugging Face stores them (OlmoHybridForCausalLM; Ai2, 2026): OLMo 2's attention
layers between gated DeltaNet layers, each layer type placing its norms its own way.

Keys as Llama's (``model.embed_tokens``, ``mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head``), and per
layer, as ``layer_types`` says (by default every fourth layer attends):

- "full_attention": OLMo 2's layer (gptzoo.hf.olmo2), norms after the sublayers (x + norm(attn(x)): gptzoo's
  "reordered", ``post_attention_layernorm`` and ``post_feedforward_layernorm``), ``self_attn.{q,k,v,o}_proj``
  with ``q_norm``/``k_norm`` over the whole projections (qk_norm "full"), RoPE of ``rope_theta``, or no
  positions at all when config.json's rope_theta is null (the released checkpoints: NoPE);
- "linear_attention": a Pre-LN layer (``input_layernorm``, ``post_attention_layernorm``) whose token mixer is
  gptzoo's ``gated_deltanet``: ``linear_attn.{q,k,v,g}_proj`` one after another are its in_proj (g is its z),
  ``b_proj`` and ``a_proj`` its gate_proj, ``conv1d``, ``A_log``, ``dt_bias``, ``o_norm`` (whose epsilon is
  fla's 1e-5, not rms_norm_eps) and ``o_proj``; ``linear_allow_neg_eigval`` (default true) doubles beta.

Every RMSNorm multiplies by its weight in float32 (rmsnorm ``scale_in_float32``), as OLMo 2's. In a recipe the
layer types are ``linear`` and ``full``: [model] holds the attention layers' components and placement,
``[model.layer_types.linear]`` the gated DeltaNet and ``norm_placement = "pre"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.gemma import shortest_period
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import (
    ACTIVATIONS,
    Llama,
    attention_fields,
    attention_maps,
    odd_head_dim,
    plain_embeddings_and_logits,
    rope_position,
)
from gptzoo.hf.qwen3_5 import DELTANET_FIELDS, FULL, LAYER_TYPE, LINEAR, deltanet_maps, joined
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT, PreNormBlock, ReorderedBlock
from gptzoo.recipe import Recipe

NORM_EPS = 1e-5
"""The epsilon of OLMo Hybrid's gated output norm (fla's FusedRMSNormGated default), whatever rms_norm_eps is."""
ROTATE = "rope_rotate_in_float32"
PLACEMENT = {LINEAR: "pre", FULL: "reordered"}
"""Each of transformers' layer types -> where its norms sit."""
BLOCK_PARTS: dict[type, Mapping[str, str]] = {
    ReorderedBlock: {"attn": "", "ln_1": "feedforward_layer_norm", "mlp": "mlp", "ln_2": "post_feedforward_layernorm"},
    PreNormBlock: {"ln_1": "attention_layer_norm", "attn": "", "ln_2": "feedforward_layer_norm", "mlp": "mlp"},
}
"""Our block's parts -> theirs under model.layers.N, by block class ("": the token mixer's layout names it), as
the checkpoints store them: transformers renames them on load (attention_layer_norm is its input_layernorm, and
feedforward_layer_norm its post_attention_layernorm, which in an attention layer follows the attention)."""


def olmo_hybrid_maps(net: Any) -> list[TensorMap] | None:
    """OLMo Hybrid's: q, k, v and g (our z) each in its own projection, b and a too, a convolution each for q, k
    and v; the output norm is o_norm."""
    H, Hk, at = net.heads, net.key_heads, "linear_attn."
    qk, vz = Hk * net.key_dim, H * net.value_dim
    projections = joined("in_proj.weight", at, (("q_proj", qk), ("k_proj", qk), ("v_proj", vz), ("g_proj", vz)))
    gates = joined("gate_proj.weight", at, (("b_proj", H), ("a_proj", H)))
    conv = joined("conv.weight", at, (("q_conv1d", qk), ("k_conv1d", qk), ("v_conv1d", vz)))
    return deltanet_maps(net, at, projections, gates, "o_proj", norm="o_norm", conv=conv)


def olmo_hybrid_deltanet_fields(net: Any) -> dict[str, Any]:
    """The DeltaNet's config.json fields; an output norm epsilon other than 1e-5 under a name OLMo Hybrid lacks."""
    fields: dict[str, Any] = {field: getattr(net, param) for param, field in DELTANET_FIELDS.items()}
    fields.update({LAYER_TYPE: LINEAR, "linear_allow_neg_eigval": net.neg_eigval})
    return {**fields, **({"linear_norm_eps": net.norm.eps} if net.norm.eps != NORM_EPS else {})}


LAYOUT = (
    builtin(
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "olmo_hybrid",
        lambda attn: attention_maps(attn, at="self_attn."),
        lambda attn: {LAYER_TYPE: FULL, **attention_fields(attn)},
        children=(("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm")),
    ),
    builtin(  # no rotation at all rotates in float32 too: OLMo Hybrid implies it of every position
        "gptzoo_plugins._positions:NoPosition",
        "olmo_hybrid",
        lambda position: [],
        lambda position: {"rope_theta": None, ROTATE: True},
    ),
    builtin(
        "gptzoo_plugins._gated_deltanet:GatedDeltaNet", "olmo_hybrid", olmo_hybrid_maps, olmo_hybrid_deltanet_fields
    ),
)
"""The "olmo_hybrid" layout of the token mixers and of no position; every other component is mapped as Llama
maps it."""


class OlmoHybrid(Llama):
    name = "olmo_hybrid"
    model_type = "olmo_hybrid"
    architecture = "OlmoHybridForCausalLM"
    title = "OLMo Hybrid"
    layout = "olmo_hybrid"
    extends = Llama()
    component_layouts = LAYOUT
    known = frozenset({*DELTANET_FIELDS.values(), "linear_allow_neg_eigval"})
    implied: Mapping[str, Any] = {"rms_norm_scale_in_float32": True, ROTATE: True}
    per_layer = frozenset({LAYER_TYPE, "qk_norm"})
    size_defaults = {"context_length": 65536}

    def parts_of(self, block: Any) -> Mapping[str, str]:
        return BLOCK_PARTS.get(type(block), {})

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, n_layer = sizes["n_embd"], sizes["n_head"], sizes["n_layer"]
        head_dim = f.integer("head_dim", n_embd // n_head) if n_head else 0
        model: dict[str, Any] = {
            **sizes,
            **({"head_dim": head_dim} if head_dim * n_head != n_embd else {}),
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-6), "scale_in_float32": True},
            "norm_placement": PLACEMENT[FULL],
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": self.position(f, sizes["context_length"]),
            "attention": {"name": "causal", "qk_norm": "full"},
        }
        types = f.layer_types(n_layer, (LINEAR, FULL), lambda: [FULL if i % 4 == 3 else LINEAR for i in range(n_layer)])
        if LINEAR not in types or FULL not in types:
            f.problems.append(
                f"config.json layer_types={show(types)} has no {LINEAR if LINEAR not in types else FULL!r} layer "
                f"({self.title} has both)"
            )
        if LINEAR in types:
            deltanet = {"attention": self.deltanet(f, n_head, n_embd), "norm_placement": PLACEMENT[LINEAR]}
            pattern = ["linear" if t == LINEAR else "full" for t in shortest_period(types)]
            layer_types = {"linear": deltanet, **({"full": {}} if "full" in pattern else {})}
            model.update(layer_pattern=pattern, layer_types=layer_types)
        if config.get("attention_bias") and f.flag("attention_bias", False):
            f.problems.append(
                "config.json attention_bias=true is not supported (OLMo Hybrid's MLP and DeltaNet have no biases, and "
                "gptzoo's bias covers them all)"
            )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    @staticmethod
    def position(f: Fields, context_length: int) -> dict[str, Any] | str:
        """RoPE rotated in float32, or none where config.json's rope_theta is null (transformers 4.x's field or
        inside rope_parameters)."""
        parameters = f.mapping("rope_parameters")
        source = parameters if "rope_parameters" in f.config and parameters else f.config
        if "rope_theta" in source and source["rope_theta"] is None:
            return "none"
        return {**rope_position(f, context_length), "rotate_in_float32": True}

    @staticmethod
    def deltanet(f: Fields, n_head: int, n_embd: int) -> dict[str, Any]:
        """The gated_deltanet of the linear-attention layers, with OlmoHybridConfig's defaults (n_head key and
        value heads, key heads of 3/4 of the width shared out, value heads twice as wide)."""
        key_heads = f.integer("linear_num_key_heads", n_head)
        heads = f.integer("linear_num_value_heads", n_head)
        key_dim = f.integer("linear_key_head_dim", max(1, int(0.75 * n_embd / key_heads)) if key_heads else 1)
        value_dim = f.integer("linear_value_head_dim", 2 * key_dim)
        if heads % key_heads:
            f.problems.append(
                f"config.json linear_num_value_heads={heads} is not a multiple of linear_num_key_heads={key_heads} "
                "(each key head serves as many value heads)"
            )
        return {
            "name": "gated_deltanet",
            "heads": heads,
            "key_heads": key_heads,
            "key_dim": key_dim,
            "value_dim": value_dim,
            "kernel": f.integer("linear_conv_kernel_dim", 4),
            "neg_eigval": f.flag("linear_allow_neg_eigval", True),
            "norm_eps": NORM_EPS,
        }

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        """The convolution's three tensors re-split into q's, k's and v's rows wherever the file splits their
        concatenation otherwise: transformers reads them by concatenating, and its save_pretrained (5.25)
        writes three equal thirds whatever the sizes."""
        tensors = super().normalize(tensors, model, source)
        for _, theirs, tmap in self.tensor_map(model):
            if not theirs[0].endswith("q_conv1d.weight") or not all(key in tensors for key in theirs):
                continue
            whole = torch.cat([tensors[key] for key in theirs])
            if [tensors[key].shape[0] for key in theirs] != list(tmap.sizes) and whole.shape[0] == sum(tmap.sizes):
                tensors.update(zip(theirs, whole.split(list(tmap.sizes)), strict=True))
        return tensors

    def placement_reasons(self, recipe: Recipe) -> list[str]:
        return []  # each layer's placement is checked against its token mixer (layer_config)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        reasons = [f"bias=true ({self.title}'s MLP has no biases)"] if recipe.model.bias else []
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        # OlmoHybridConfig's default pad_token_id, 100277, is no token of a smaller vocabulary (transformers would
        # refuse to build the embedding)
        return {**self.write_sizes(recipe), **odd_head_dim(recipe), "attention_bias": False, "pad_token_id": None}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        m = recipe.model
        types, schedule = values[LAYER_TYPE], m.schedule()
        for i, kind in enumerate(types):
            placement = m.placement(schedule[i])
            if placement != PLACEMENT[kind]:
                reasons.append(
                    f"layer {i} ({kind}) has norm_placement {placement!r} ({self.title}'s attention layers are "
                    f"{PLACEMENT[FULL]!r}, its DeltaNet layers {PLACEMENT[LINEAR]!r})"
                )
                break
        for i, kind in enumerate(types):
            qk_norm = values["qk_norm"][i]
            if kind == FULL and qk_norm != "full":
                reasons.append(
                    f"layer {i}'s attention has qk_norm {qk_norm or 'none'!r} ({self.title} normalizes the whole q "
                    "and k projections: 'full')"
                )
                break
        if LINEAR not in types or FULL not in types:
            reasons.append(f"layer types {show(sorted(set(types)))} ({self.title} has DeltaNet and attention layers)")
        return {"layer_types": types}

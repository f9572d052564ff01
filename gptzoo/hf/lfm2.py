"""LFM2 checkpoints as Hugging Face stores them (Lfm2ForCausalLM; Liquid AI, 2025): gated short
convolutions with a few attention layers between them.

Keys: ``model.embed_tokens``, ``model.layers.N.{operator_norm, ffn_norm}`` (Pre-LN RMSNorms of epsilon
``norm_eps``), ``feed_forward.{w1, w3, w2}`` (a SwiGLU: gate, up, down), and per layer, as config.json's
``layer_types`` says, either ``self_attn.{q,k,v,out}_proj`` with per-head ``q_layernorm``/``k_layernorm``
("full_attention") or ``conv.{in_proj, conv, out_proj}`` (gptzoo's ``short_conv`` of ``conv_L_cache``
taps, "conv"); the final norm is ``model.embedding_norm``; the head is tied. No biases (``conv_bias``
is refused by name). The MLP's width is ``intermediate_size``, by default adjusted as LFM2 does
(``block_auto_adjust_ff_dim``: two thirds, times ``block_ffn_dim_multiplier``, rounded up to
``block_multiple_of``); export writes the width itself and no adjustment.

In a recipe the layer types are ``conv`` and ``full``: ``layer_pattern`` is the shortest repeating run
of config.json's layer_types, [model] holds the attention layers' components and
``[model.layer_types.conv]`` the convolution. Each part of a layer is mapped from the layer itself
(``model.layers.N.``): a token mixer's layout says whether it sits under ``self_attn.`` or ``conv.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import SIZES, Fields, refuse, show
from gptzoo.hf.gemma import shortest_period
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.llama import (
    Llama,
    attention_fields,
    attention_maps,
    gated_mlp_maps,
    kinds,
    rope_fields,
    rope_layouts,
    rope_position,
)
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe

CONV, FULL = "conv", "full_attention"
"""transformers' layer types."""
LAYER_TYPE = "layer_type"
"""The per-layer field each token mixer's layout gives: which of LFM2's layer types it is."""


def _conv_maps(conv: Any) -> list[TensorMap]:
    names = {"in_proj": "in_proj", "conv": "conv", "c_proj": "out_proj"}
    return [
        TensorMap(f"{ours}.{k}", (f"conv.{theirs}.{k}",))
        for ours, theirs in names.items()
        for k in kinds(getattr(conv, ours))
    ]


LAYOUT = (
    builtin(
        "gptzoo_plugins._norms:RMSNorm",
        "lfm2",
        lambda norm: same("weight"),
        lambda norm: {"norm_eps": norm.eps, **({"rms_norm_scale_in_float32": True} if norm.scale_in_float32 else {})},
    ),
    builtin("gptzoo_plugins._activations:SiLU", "lfm2", lambda act: [], lambda act: {}),
    builtin("gptzoo_plugins._mlps:GatedMLP", "lfm2", lambda mlp: gated_mlp_maps(mlp, ("w1", "w3", "w2"))),
    *rope_layouts("lfm2", rope_fields("rope_theta", "partial_rotary_factor")),
    builtin(
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "lfm2",
        lambda attn: attention_maps(attn, at="self_attn.", out="out_proj"),
        lambda attn: {LAYER_TYPE: FULL, **attention_fields(attn)},
        children=(("q_norm", "self_attn.q_layernorm"), ("k_norm", "self_attn.k_layernorm")),
    ),
    builtin(
        "gptzoo_plugins._short_conv:ShortConv",
        "lfm2",
        _conv_maps,
        lambda conv: {LAYER_TYPE: CONV, "conv_L_cache": conv.kernel},
    ),
)
"""The "lfm2" layout of the built-in components (the MLP's activation is SiLU, which LFM2 does not name)."""


def mlp_width(f: Fields) -> int:
    """The MLP's width: intermediate_size (older files: block_ff_dim), adjusted as LFM2 does unless
    block_auto_adjust_ff_dim is false."""
    width = f.integer("intermediate_size", f.integer("block_ff_dim", 12288))
    if not f.flag("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = f.config.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        width = int(f.number("block_ffn_dim_multiplier", 1.0) * width)
        multiple = f.integer("block_multiple_of", 256)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


class Lfm2(Llama):
    """Llama's skeleton with LFM2's names, and each layer's token mixer mapped from the layer itself."""

    name = "lfm2"
    model_type = "lfm2"
    architecture = "Lfm2ForCausalLM"
    title = "LFM2"
    layout = "lfm2"
    component_layouts = LAYOUT
    required = {"norm_eps": "norm", "rope_theta": "position"}
    known = frozenset({"rope_scaling", "conv_L_cache"})
    per_layer = frozenset({LAYER_TYPE, "qk_norm"})
    sizes = tuple(s for s in SIZES if s.ours not in ("d_ff", "tie_embeddings", "context_length"))
    block_parts: Mapping[str, str] = {"ln_1": "operator_norm", "attn": "", "ln_2": "ffn_norm", "mlp": "feed_forward"}
    final_norm = "embedding_norm"

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_layer = sizes["n_layer"]
        tied = f.flag("tie_word_embeddings", f.flag("tie_embedding", True))
        context_length = f.integer("max_position_embeddings", 128000)
        model: dict[str, Any] = {
            **sizes,
            "d_ff": mlp_width(f),
            "context_length": context_length,
            "tie_embeddings": tied,
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": f.number("norm_eps", 1e-5)},
            "norm_placement": "pre",
            "activation": "silu",
            "mlp": "gated",
            "position": rope_position(f, context_length),
            "attention": {"name": "causal", "qk_norm": "head"},
        }
        types = self.layer_types(f, config, n_layer)
        if CONV in types:
            pattern = ["conv" if t == CONV else "full" for t in shortest_period(types)]
            conv = {"attention": {"name": "short_conv", "kernel": f.integer("conv_L_cache", 3)}}
            model.update(
                layer_pattern=pattern, layer_types={"conv": conv, **({"full": {}} if "full" in pattern else {})}
            )
        if config.get("conv_bias") and f.flag("conv_bias", False):
            f.problems.append("config.json conv_bias=true is not supported (gptzoo's LFM2 has no biases)")
        f.problems += refuse(config, {"use_pos_enc": True})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def layer_types(self, f: Fields, config: Mapping[str, Any], n_layer: int) -> list[str]:
        """config.json's layer_types, else the layers full_attn_idxs names are attention layers (all of them
        without either, as transformers does)."""

        def by_index() -> list[str]:
            indices = config.get("full_attn_idxs")
            if indices is None:
                return [FULL] * n_layer
            if not isinstance(indices, list) or not all(type(i) is int and 0 <= i < n_layer for i in indices):
                f.problems.append(
                    f"config.json full_attn_idxs={show(indices)} is not a list of layer indices below {n_layer}"
                )
                return [FULL] * n_layer
            return [FULL if i in indices else CONV for i in range(n_layer)]

        return f.layer_types(n_layer, (CONV, FULL), by_index)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, super().structural_reasons(recipe)
        if m.bias:
            reasons.append("bias=true (LFM2 has no biases)")
        if m.head_dim * m.n_head != m.n_embd:
            reasons.append(f"head_dim={m.head_dim} (LFM2's heads split hidden_size: {m.n_embd // m.n_head})")
        return reasons

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        return {
            **self.write_sizes(recipe),
            "intermediate_size": m.d_ff,
            "block_auto_adjust_ff_dim": False,
            "max_position_embeddings": m.context_length,
            "tie_word_embeddings": m.tie_embeddings,
            "conv_bias": False,
        }

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        types = values[LAYER_TYPE]
        for i, (kind, qk_norm) in enumerate(zip(types, values["qk_norm"], strict=True)):
            if kind == FULL and qk_norm != "head":
                reasons.append(
                    f"layer {i}'s attention has qk_norm {qk_norm or 'none'!r} (LFM2 normalizes each head's q and k)"
                )
                break
        return {"layer_types": types}

"""Qwen3.5 checkpoints as Hugging Face stores them (Qwen3_5ForCausalLM, model_type ``qwen3_5_text``; Qwen
Team, 2026): gated DeltaNet layers with a full-attention layer every ``full_attention_interval`` (3:1).

Keys as Llama's (``model.embed_tokens``, ``model.layers.N.{input_layernorm, post_attention_layernorm}``,
``mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head`` unless tied), every norm a Gemma-style RMSNorm (a
weight that is an offset from 1, epsilon ``rms_norm_eps``), and per layer, as ``layer_types`` says, either
``self_attn.{q,k,v,o}_proj`` with per-head ``q_norm``/``k_norm`` and the output gate ("full_attention": q_proj
holds each head's query then its gate, as gptzoo's ``output_gate``; partial RoPE, ``partial_rotary_factor``)
or ``linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm, out_proj}``
("linear_attention": gptzoo's ``gated_deltanet``, its one in_proj the four of theirs one after another).
The text positions of Qwen3.5's multimodal RoPE (mrope_section) are one position thrice: plain RoPE.

A checkpoint saved as the vision-language class (Qwen3_5ForConditionalGeneration, model_type ``qwen3_5``)
keeps this text model under ``model.language_model.`` and its config under ``text_config``: gptzoo loads its
text part (:class:`Qwen3_5VisionLanguage`) and leaves the vision tower. The multi-token-prediction layers
(``mtp.*``, which transformers does not load either) are left too.

In a recipe the layer types are ``linear`` and ``full``: ``layer_pattern`` is the shortest repeating run of
config.json's layer_types, [model] holds the full-attention layers' components and
``[model.layer_types.linear]`` the gated DeltaNet.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.gemma import shortest_period
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.llama import (
    ACTIVATIONS,
    Llama,
    activation_layouts,
    attention_fields,
    attention_maps,
    gated_mlp_maps,
    plain_embeddings_and_logits,
    rope_fields,
    rope_layouts,
    rope_position,
)
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe

LINEAR, FULL = "linear_attention", "full_attention"
"""transformers' layer types."""
LAYER_TYPE = "layer_type"
"""The per-layer field each token mixer's layout gives: which of Qwen3.5's layer types it is."""
DELTANET_FIELDS = {
    "heads": "linear_num_value_heads",
    "key_heads": "linear_num_key_heads",
    "key_dim": "linear_key_head_dim",
    "value_dim": "linear_value_head_dim",
    "kernel": "linear_conv_kernel_dim",
}
"""gated_deltanet's parameters -> config.json's fields (the same in Qwen3-Next and OLMo Hybrid)."""


def joined(ours: str, at: str, parts: tuple[tuple[str, int], ...]) -> TensorMap:
    """Ours as their projections ``parts`` (each a name under ``at`` and its rows), one after another."""
    names, sizes = zip(*parts, strict=True)
    return TensorMap(ours, tuple(f"{at}{n}.weight" for n in names), sizes=sizes if len(names) > 1 else ())


def grouped(ours: str, theirs: str, parts: tuple[int, ...], groups: int) -> TensorMap:
    """Ours (``parts`` one after another) as one projection of theirs holding them interleaved in ``groups``."""
    return TensorMap(ours, (theirs,), parts=parts, groups=groups) if groups > 1 else TensorMap(ours, (theirs,))


def deltanet_maps(
    net: Any,
    at: str,
    projections: TensorMap,
    gates: TensorMap,
    out: str,
    *,
    norm: str = "norm",
    conv: TensorMap | None = None,
) -> list[TensorMap] | None:
    """gated_deltanet's in_proj (rows q, k and v, then z) as ``projections`` and its gate_proj (b, then a) as
    ``gates``, its convolution as ``conv`` (default: ``at`` conv1d), its output norm ``norm``, c_proj ``out``;
    None with biases (no family has them)."""
    if any(linear.bias is not None for linear in (net.in_proj, net.gate_proj, net.c_proj)):
        return None
    return [
        projections,
        gates,
        conv or TensorMap("conv.weight", (f"{at}conv1d.weight",)),
        *(TensorMap(p, (f"{at}{p}",)) for p in ("A_log", "dt_bias")),
        TensorMap("norm.weight", (f"{at}{norm}.weight",)),
        TensorMap("c_proj.weight", (f"{at}{out}.weight",)),
    ]


def qwen3_5_maps(net: Any) -> list[TensorMap] | None:
    """Qwen3.5's: q, k and v in one projection, z, b and a each in its own."""
    H, at = net.heads, "linear_attn."
    projections = joined("in_proj.weight", at, (("in_proj_qkv", net.channels), ("in_proj_z", H * net.value_dim)))
    gates = joined("gate_proj.weight", at, (("in_proj_b", H), ("in_proj_a", H)))
    return deltanet_maps(net, at, projections, gates, "out_proj")


def deltanet_fields(net: Any) -> dict[str, Any]:
    """gated_deltanet's config.json fields; OLMo Hybrid's negative eigenvalues only where it has them."""
    fields: dict[str, Any] = {field: getattr(net, param) for param, field in DELTANET_FIELDS.items()}
    fields.update({LAYER_TYPE: LINEAR, "rms_norm_eps": net.norm.eps})
    return {**fields, **({"linear_allow_neg_eigval": True} if net.neg_eigval else {})}


def read_deltanet(f: Fields, eps: float) -> dict[str, Any]:
    """The gated_deltanet component of a config.json's linear-attention layers (transformers' defaults)."""
    defaults = {"heads": 32, "key_heads": 16, "key_dim": 128, "value_dim": 128, "kernel": 4}
    params = {param: f.integer(field, defaults[param]) for param, field in DELTANET_FIELDS.items()}
    if params["heads"] % params["key_heads"]:
        f.problems.append(
            f"config.json linear_num_value_heads={params['heads']} is not a multiple of linear_num_key_heads="
            f"{params['key_heads']} (each key head serves as many value heads)"
        )
    return {"name": "gated_deltanet", **params, "norm_eps": eps}


def hybrid_schedule(types: list[str], dense: list[bool], deltanet: dict[str, Any]) -> dict[str, Any]:
    """[model] entries for each layer's token mixer (``types``: transformers' layer types) and mlp (``dense``:
    the gated MLP instead of [model]'s, Qwen3-Next's mlp_only_layers): what every layer shares in [model]
    itself, and what varies as a layer_pattern (the shortest repeating run) of layer types named by the
    mixer, "linear" (``deltanet``) or "full", then "dense" or "moe" when layers differ in their mlp."""
    out: dict[str, Any] = {"mlp": "gated"} if all(dense) else {}
    vary_mlp = len(set(dense)) > 1
    if LINEAR not in types and not vary_mlp:
        return out
    names: list[str] = []
    layer_types: dict[str, dict[str, Any]] = {}
    for kind, plain in zip(types, dense, strict=True):
        name = ("linear" if kind == LINEAR else "full") + (("_dense" if plain else "_moe") if vary_mlp else "")
        spec = {"attention": deltanet} if kind == LINEAR else {}
        layer_types.setdefault(name, {**spec, **({"mlp": "gated"} if vary_mlp and plain else {})})
        names.append(name)
    return {**out, "layer_pattern": shortest_period(names), "layer_types": layer_types}


LAYOUT = (
    builtin(
        "gptzoo_plugins._norms:GemmaRMSNorm",
        "qwen3_5",
        lambda norm: same("weight"),
        lambda norm: {"rms_norm_eps": norm.eps, "rms_norm_offset": 1.0},
    ),
    *activation_layouts("qwen3_5"),
    builtin("gptzoo_plugins._mlps:GatedMLP", "qwen3_5", gated_mlp_maps),
    *rope_layouts("qwen3_5", rope_fields("rope_theta", "partial_rotary_factor")),
    builtin(
        "gptzoo_plugins._attentions:CausalSelfAttention",
        "qwen3_5",
        lambda attn: attention_maps(attn, at="self_attn."),
        lambda attn: {LAYER_TYPE: FULL, **attention_fields(attn)},
        children=(("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm")),
    ),
    builtin(
        "gptzoo_plugins._gated_deltanet:GatedDeltaNet",
        "qwen3_5",
        qwen3_5_maps,
        deltanet_fields,
    ),
)
"""The "qwen3_5" layout of the built-in components."""


class Qwen3_5(Llama):
    """Llama's skeleton with Gemma's norms, and each layer's token mixer mapped from the layer itself."""

    name = "qwen3_5_text"
    model_type = "qwen3_5_text"
    architecture = "Qwen3_5ForCausalLM"
    title = "Qwen3.5"
    layout = "qwen3_5"
    component_layouts = LAYOUT
    required = {"rms_norm_eps": "norm", "hidden_act": "activation", "rope_theta": "position"}
    known = frozenset({"partial_rotary_factor", *DELTANET_FIELDS.values()})
    implied: Mapping[str, Any] = {"rms_norm_offset": 1.0}
    per_layer = frozenset({LAYER_TYPE, "qk_norm", "attn_output_gate"})
    size_defaults = {"context_length": 32768}
    block_parts: Mapping[str, str] = {
        "ln_1": "input_layernorm",
        "attn": "",
        "ln_2": "post_attention_layernorm",
        "mlp": "mlp",
    }
    dropped = ("mtp.",)
    """Prefixes of tensors the checkpoint may hold that gptzoo leaves (the multi-token-prediction layers)."""

    def text_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """The text model's config.json fields."""
        return config

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        config = self.text_config(config)
        f = Fields(config, self.field_prefix)
        sizes = self.read_sizes(f)
        n_layer, eps = sizes["n_layer"], f.number("rms_norm_eps", 1e-6)
        head_dim = f.integer("head_dim", 256)
        parameters = f.mapping("rope_parameters")
        fraction = parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            f.problems.append(f"{self.field_prefix}partial_rotary_factor={show(fraction)} is not a number in (0, 1]")
            fraction = 1.0
        model: dict[str, Any] = {
            **sizes,
            "head_dim": head_dim,
            "bias": False,
            "norm": {"name": "gemma_rmsnorm", "eps": eps},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": self.mlp(f),
            "position": rope_position(f, sizes["context_length"], fraction=float(fraction)),
            "attention": {"name": "causal", "qk_norm": "head", "output_gate": True},
        }
        types, dense = self.layer_types(f, config, n_layer), self.dense_layers(f, n_layer)
        model.update(hybrid_schedule(types, dense, read_deltanet(f, eps)))
        for key, supported in (("attention_bias", False), ("attn_output_gate", True)):
            if key in config and config[key] != supported:
                f.problems.append(
                    f"{self.field_prefix}{key}={show(config[key])} is not supported ({self.title}'s attention has "
                    f"{key}={supported})"
                )
        f.problems += refuse(config, {"mamba_ssm_dtype": "float32", "mtp_use_dedicated_embeddings": False})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    field_prefix = "config.json "
    """How messages name a field of the text model's config."""

    def mlp(self, f: Fields) -> str | dict[str, Any]:
        """The mlp of the layers (those of :meth:`dense_layers` aside): Qwen3.5's gated MLP."""
        return "gated"

    def dense_layers(self, f: Fields, n_layer: int) -> list[bool]:
        """Which layers have the gated MLP of intermediate_size instead of :meth:`mlp`: Qwen3.5's all have
        that MLP, and mlp_only_layers (a field its config class carries) is refused."""
        only = f.config.get("mlp_only_layers")
        if only:
            f.problems.append(f"{self.field_prefix}mlp_only_layers={show(only)} is not supported")
        return [False] * n_layer

    def layer_types(self, f: Fields, config: Mapping[str, Any], n_layer: int) -> list[str]:
        """config.json's layer_types, else one full-attention layer every full_attention_interval."""

        def every() -> list[str]:
            n = f.integer("full_attention_interval", 4)
            return [FULL if (i + 1) % n == 0 else LINEAR for i in range(n_layer)]

        return f.layer_types(n_layer, (LINEAR, FULL), every)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "pre":
            reasons.append(f"norm_placement {m.norm_placement!r} ({self.title} is Pre-LN)")
        if m.bias:
            reasons.append(f"bias=true ({self.title} has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return {**self.write_sizes(recipe), "head_dim": recipe.model.head_dim, "attention_bias": False}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        types = values[LAYER_TYPE]
        for i, kind in enumerate(types):
            if kind != FULL:
                continue
            qk_norm, gate = values["qk_norm"][i], values["attn_output_gate"][i]
            if qk_norm != "head" or not gate:
                reasons.append(
                    f"layer {i}'s attention has qk_norm {qk_norm or 'none'!r} and output_gate={bool(gate)} "
                    f"({self.title} normalizes each head's q and k and gates its output)"
                )
                break
        return {"layer_types": types}

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(self.dropped)}
        return super().normalize(tensors, model, source)


class Qwen3_5VisionLanguage(Qwen3_5):
    """The text part of a checkpoint saved as Qwen3_5ForConditionalGeneration; export writes Qwen3_5ForCausalLM."""

    name = "qwen3_5"
    model_type = "qwen3_5"
    architecture = "Qwen3_5ForConditionalGeneration"
    title = "Qwen3.5 (vision-language)"
    exports = False
    prefix = "model.language_model."
    embedding = "model.language_model.embed_tokens.weight"
    dropped = ("mtp.", "model.visual.")
    field_prefix = "config.json text_config."

    def text_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        text = config.get("text_config")
        return text if isinstance(text, dict) else {}

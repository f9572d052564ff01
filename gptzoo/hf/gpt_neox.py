"""GPT-NeoX checkpoints as Hugging Face stores them (GPTNeoXForCausalLM; Black et al., 2022), the
architecture of EleutherAI's Pythia suite (Biderman et al., 2023).

Keys: ``gpt_neox.embed_in``, ``gpt_neox.layers.N.{input_layernorm, attention.{query_key_value,
dense}, post_attention_layernorm, mlp.{dense_h_to_4h, dense_4h_to_h}}``, ``gpt_neox.final_layer_norm``
and ``embed_out`` (the head; transformers 5 also reads it as ``lm_head``). nn.Linear layout [out, in],
biases everywhere (``attention_bias`` covers the attention's; the MLP's and the LayerNorms' are always
there). ``query_key_value`` interleaves q, k and v head by head (rows [q_h; k_h; v_h] for each head h),
which the attention's map undoes. Each block reads its input twice when ``use_parallel_residual``
(x + attn(ln_1 x) + mlp(ln_2 x): gptzoo's "parallel"), else it is Pre-LN. RoPE in the rotate-half
convention on the first ``rotary_pct`` of each head (partial rotary; Pythia: 0.25), base
``rotary_emb_base``; transformers 5 writes both into ``rope_parameters`` (rope_theta,
partial_rotary_factor) and reads no top-level rope_theta. Older files carry per-layer mask buffers
(``attention.bias``, ``attention.masked_bias``) and ``attention.rotary_emb.inv_freq``: ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from gptzoo.hf.family import SIZES, Family, Fields, Part, refuse
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.llama import (
    ACTIVATIONS,
    activation_layouts,
    attention_fields,
    kinds,
    plain_embeddings_and_logits,
    rope_fields,
    rope_layouts,
    rope_position,
)
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe

PREFIX = "gpt_neox."
NAMES = {"ln_1": "input_layernorm", "attn": "attention", "ln_2": "post_attention_layernorm", "mlp": "mlp"}
"""gptzoo's block parts -> GPT-NeoX's."""


def attention_maps(attn: Any) -> list[TensorMap] | None:
    """query_key_value holds each head's q, k and v rows together, so no GQA (its features are attention_fields')."""
    if attn.n_kv_head != attn.n_head:
        return None
    parts = (attn.n_head * attn.head_dim,) * 3
    maps = [
        TensorMap(f"c_attn.{k}", (f"query_key_value.{k}",), parts=parts, groups=attn.n_head) for k in kinds(attn.c_attn)
    ]
    return maps + [TensorMap(f"c_proj.{k}", (f"dense.{k}",)) for k in kinds(attn.c_proj)]


def dense_mlp_maps(mlp: Any) -> list[TensorMap] | None:
    """nn.Linear layers dense_h_to_4h and dense_4h_to_h; GPT-NeoX's MLP always has biases."""
    if mlp.c_fc.bias is None:
        return None
    names = {"c_fc": "dense_h_to_4h", "c_proj": "dense_4h_to_h"}
    return [TensorMap(f"{ours}.{k}", (f"{theirs}.{k}",)) for ours, theirs in names.items() for k in ("weight", "bias")]


LAYOUT = (
    builtin(
        "gptzoo_plugins._norms:LayerNorm",
        "gpt_neox",
        lambda norm: same("weight", "bias") if norm.bias is not None else None,  # its LayerNorms have a bias
        lambda norm: {"layer_norm_eps": norm.eps},
    ),
    *activation_layouts("gpt_neox"),
    builtin("gptzoo_plugins._mlps:DenseMLP", "gpt_neox", dense_mlp_maps),
    # its own names for rope's base and fraction, the fraction always (its default rotary_pct is 0.25)
    *rope_layouts("gpt_neox", rope_fields("rotary_emb_base", "rotary_pct", always_fraction=True)),
    builtin("gptzoo_plugins._attentions:CausalSelfAttention", "gpt_neox", attention_maps, attention_fields),
)
"""The "gpt_neox" layout of the built-in components."""


class GPTNeoX(Family):
    name = "gpt_neox"
    model_type = "gpt_neox"
    architecture = "GPTNeoXForCausalLM"
    embedding = PREFIX + "embed_in.weight"
    head = "embed_out.weight"
    ignored_tensors = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
    title = "GPT-NeoX"
    component_layouts = LAYOUT
    required = {
        "layer_norm_eps": "norm",
        "hidden_act": "activation",
        "rotary_emb_base": "position",
        "rotary_pct": "position",
    }
    known = frozenset({"rope_scaling"})
    sizes = tuple(size for size in SIZES if size.ours != "n_kv_head")  # one key/value head per query head

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        model = {
            **sizes,
            "bias": True,
            "norm": {"name": "layernorm", "eps": f.number("layer_norm_eps", 1e-5)},
            "norm_placement": "parallel" if f.flag("use_parallel_residual", True) else "pre",
            "activation": f.choice("hidden_act", "gelu", ACTIVATIONS),
            "mlp": "dense",
            "position": self.rope(f, sizes["context_length"]),
            "attention": "causal",
        }
        if not f.flag("attention_bias", True):
            f.problems.append(
                "config.json attention_bias=false is not supported (GPT-NeoX's MLP always has biases, and "
                "gptzoo's bias covers the attention and the MLP alike)"
            )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    @staticmethod
    def rope(f: Fields, context_length: int) -> dict[str, Any]:
        """The rope position as transformers reads GPT-NeoX's config: rope_scaling, else rope_parameters,
        gives the type and (when it has them) rope_theta and partial_rotary_factor; the legacy
        rotary_emb_base (10000) and rotary_pct (0.25) give what it lacks."""
        source = "rope_scaling" if f.mapping("rope_scaling") else "rope_parameters"
        table = f.mapping(source)
        inner = Fields(table, f"config.json {source}.")
        theta = inner.number("rope_theta", 0.0) if "rope_theta" in table else f.number("rotary_emb_base", 10000.0)
        fraction = (
            inner.number("partial_rotary_factor", 0.0)
            if "partial_rotary_factor" in table
            else f.number("rotary_pct", 0.25)
        )
        f.problems += inner.problems
        return rope_position(f, context_length, parameters={"rope_theta": theta}, scaling=table, fraction=fraction)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement not in ("parallel", "pre"):
            reasons.append(
                f"norm_placement {m.norm_placement!r} (GPT-NeoX is parallel, or pre with use_parallel_residual=false)"
            )
        if m.n_kv_head != m.n_head or m.head_dim * m.n_head != m.n_embd:
            reasons.append(
                f"n_kv_head={m.n_kv_head}, head_dim={m.head_dim} (GPT-NeoX has n_head heads of n_embd/n_head)"
            )
        if not m.bias:
            reasons.append("bias=false (GPT-NeoX's MLP always has biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        return {
            **self.write_sizes(recipe),
            "attention_bias": m.bias,
            "use_parallel_residual": m.norm_placement == "parallel",
        }

    def parts(self, model: GPT) -> list[Part]:
        weight = same("weight")
        parts = [Part(model.wte, "wte.", PREFIX + "embed_in.", weight), Part(model.position, "position.", PREFIX)]
        parts += [Part(p, f"layer_positions.{i}.", PREFIX) for i, p in enumerate(model.layer_positions)]
        for i, block in enumerate(model.blocks):
            parts += [
                Part(getattr(block, ours), f"blocks.{i}.{ours}.", f"{PREFIX}layers.{i}.{theirs}.")
                for ours, theirs in NAMES.items()
            ]
        parts.append(Part(model.ln_f, "ln_f.", PREFIX + "final_layer_norm."))
        if not model.tied:
            parts.append(Part(model.lm_head, "lm_head.", "embed_out.", weight))
        return parts

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        if "lm_head.weight" in tensors and self.head not in tensors:  # the head under transformers 5's own name
            tensors = {self.head if k == "lm_head.weight" else k: v for k, v in tensors.items()}
        return super().normalize(tensors, model, source)

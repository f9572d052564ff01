"""OpenAI GPT-2 as Hugging Face stores it (GPT2LMHeadModel; Radford et al., 2019).

Keys start with ``transformer.``; older files have no prefix and carry the ``attn.bias`` /
``attn.masked_bias`` mask buffers; a tied ``lm_head.weight`` is usually absent. Linear weights
are Conv1D, [in, out]: the components' maps transpose them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from gptzoo.hf.family import Family, Fields, Part, Size, refuse
from gptzoo.hf.layouts import builtin, same
from gptzoo.hf.llama import attention_fields, plain_embeddings_and_logits
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe
from gptzoo.recipe.schema import MAX_DIM

ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
"""config.json activation_function -> gptzoo activation (HF ACT2FN semantics)."""
PREFIX = "transformer."


def conv1d(*names: str, bias: bool) -> list[TensorMap]:
    """nn.Linear layers stored as Conv1D: the weight [in, out], the bias as it is."""
    maps = [TensorMap(f"{name}.weight", (f"{name}.weight",), transpose=True) for name in names]
    return maps + ([TensorMap(f"{name}.bias", (f"{name}.bias",)) for name in names] if bias else [])


def attention_maps(attn: Any) -> list[TensorMap]:
    """c_attn and c_proj as Conv1D (a bias on one only is attention_fields' qkv_bias, which GPT-2 refuses)."""
    return conv1d("c_attn", bias=attn.c_attn.bias is not None) + conv1d("c_proj", bias=attn.c_proj.bias is not None)


def activation(hf_name: str) -> dict[str, Any]:
    return {"weights": lambda act: [], "config": lambda act: {"activation_function": hf_name}}


LAYOUT = (
    builtin(
        "gptzoo_plugins._norms:LayerNorm",
        "gpt2",
        lambda norm: same("weight", "bias") if norm.bias is not None else None,  # GPT-2's LayerNorms have a bias
        lambda norm: {"layer_norm_epsilon": norm.eps},
    ),
    builtin("gptzoo_plugins._activations:GELU", "gpt2", **activation("gelu")),
    builtin("gptzoo_plugins._activations:GELUTanh", "gpt2", **activation("gelu_new")),
    builtin("gptzoo_plugins._activations:ReLU", "gpt2", **activation("relu")),
    builtin("gptzoo_plugins._activations:SiLU", "gpt2", **activation("silu")),
    builtin(
        "gptzoo_plugins._mlps:DenseMLP", "gpt2", lambda mlp: conv1d("c_fc", "c_proj", bias=mlp.c_fc.bias is not None)
    ),
    builtin("gptzoo_plugins._positions:LearnedPosition", "gpt2", lambda position: same("wpe.weight")),
    builtin("gptzoo_plugins._attentions:CausalSelfAttention", "gpt2", attention_maps, attention_fields),
)
"""The "gpt2" layout of the built-in components."""


class GPT2(Family):
    name = "gpt2"
    model_type = "gpt2"
    architecture = "GPT2LMHeadModel"
    embedding = PREFIX + "wte.weight"
    ignored_tensors = (".attn.bias", ".attn.masked_bias")
    title = "GPT-2"
    required = {"layer_norm_epsilon": "norm", "activation_function": "activation"}
    component_layouts = LAYOUT
    sizes = (
        Size("vocab_size", "vocab_size"),
        Size("context_length", "n_positions"),
        Size("n_embd", "n_embd"),
        Size("n_layer", "n_layer"),
        Size("n_head", "n_head"),
        Size("d_ff", "n_inner", lambda read, config: 4 * read["n_embd"]),  # unset (or null): GPT-2's 4 x n_embd
        Size("init_std", "initializer_range", 0.02),
        Size("tie_embeddings", "tie_word_embeddings", True),
    )

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        vocab_size, n_embd = sizes["vocab_size"], sizes["n_embd"]
        model = {
            **sizes,
            "bias": True,
            "norm": {"name": "layernorm", "eps": f.number("layer_norm_epsilon", 1e-5)},
            "norm_placement": "pre",
            "activation": f.choice("activation_function", "gelu_new", ACTIVATIONS),
            "mlp": "dense",
            "position": "learned",
            "attention": "causal",
        }
        if config.get("n_inner") is None and n_embd <= MAX_DIM < 4 * n_embd:
            f.problems.append(
                f"config.json n_embd={n_embd} makes the MLP width 4 x n_embd = {4 * n_embd} (n_inner is unset), "
                f"more than {MAX_DIM}; n_embd or n_inner must be smaller"
            )
        f.problems += refuse(
            config,
            {
                "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False,
                "add_cross_attention": False,
            },
        )
        f.check()
        return {"model": model, "tokenizer": {"name": "gpt2" if vocab_size == 50257 else "hf"}}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m = recipe.model
        reasons = [] if m.norm_placement == "pre" else [f"norm_placement {m.norm_placement!r} (GPT-2 is Pre-LN)"]
        if m.n_kv_head != m.n_head or m.head_dim * m.n_head != m.n_embd:
            reasons.append(f"n_kv_head={m.n_kv_head}, head_dim={m.head_dim} (GPT-2 has n_head heads of n_embd/n_head)")
        if not m.bias:
            reasons.append("bias=false (GPT-2 has biases everywhere)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return self.write_sizes(recipe)

    def parts(self, model: GPT) -> list[Part]:
        weight = same("weight")
        parts = [Part(model.wte, "wte.", PREFIX + "wte.", weight), Part(model.position, "position.", PREFIX)]
        for i, block in enumerate(model.blocks):
            parts += [
                Part(getattr(block, name), f"blocks.{i}.{name}.", f"{PREFIX}h.{i}.{name}.")
                for name in ("ln_1", "attn", "ln_2", "mlp")
            ]
        parts.append(Part(model.ln_f, "ln_f.", PREFIX + "ln_f."))
        if not model.tied:
            parts.append(Part(model.lm_head, "lm_head.", "lm_head.", weight))
        return parts

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        if not any(k.startswith(PREFIX) for k in tensors):  # the original prefix-less layout
            tensors = {k if k == "lm_head.weight" else PREFIX + k: v for k, v in tensors.items()}
        return super().normalize(tensors, model, source)

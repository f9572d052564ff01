"""OLMo 2 checkpoints as Hugging Face stores them (Olmo2ForCausalLM; Team OLMo, 2024).

Keys as Llama's (``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head``), with two differences in the block: the
norms come after the sublayers, inside the residual branch (x + norm(attn(x)), then x + norm(mlp(x)):
gptzoo's "reordered"; ``post_attention_layernorm``, ``post_feedforward_layernorm``, and no input
norm), and ``self_attn.q_norm``/``k_norm`` normalize the whole q and k projections (nh hs and nkv hs
features) before they are split into heads (gptzoo's qk_norm "full"). Every norm is an RMSNorm that
multiplies by its weight in float32 before casting back (gptzoo's rmsnorm with
``scale_in_float32 = true``); a recipe with Llama's numerics is refused. Biases on q, k, v and o
iff ``attention_bias``, never on the MLP. RoPE over whole heads (OLMo 2 reads no
partial_rotary_factor), theta ``rope_theta``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse
from gptzoo.hf.llama import ACTIVATIONS, Llama, odd_head_dim, plain_embeddings_and_logits, rope_position
from gptzoo.recipe import Recipe


class Olmo2(Llama):
    """Llama's checkpoint with the block's two norms after the sublayers (block_parts)."""

    name = "olmo2"
    layout = "llama"
    block_parts: Mapping[str, str] = {
        "attn": "self_attn",
        "ln_1": "post_attention_layernorm",
        "mlp": "mlp",
        "ln_2": "post_feedforward_layernorm",
    }
    model_type = "olmo2"
    architecture = "Olmo2ForCausalLM"
    title = "OLMo 2"
    implied: Mapping[str, Any] = {"rms_norm_scale_in_float32": True, "qk_norm": "full", "rope_rotate_in_float32": True}

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, context_length = sizes["n_embd"], sizes["n_head"], sizes["context_length"]
        head_dim = f.integer("head_dim", n_embd // n_head) if n_head else 0
        model = {
            **sizes,
            **({"head_dim": head_dim} if head_dim * n_head != n_embd else {}),
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-5), "scale_in_float32": True},
            "norm_placement": "reordered",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": {**rope_position(f, context_length), "rotate_in_float32": True},
            "attention": {"name": "causal", "qk_norm": "full"},
        }
        if config.get("attention_bias") and f.flag("attention_bias", False):
            f.problems.append(
                "config.json attention_bias=true is not supported (OLMo 2's MLP has no biases, and gptzoo's bias "
                "covers the attention and the MLP alike)"
            )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "reordered":
            reasons.append(f"norm_placement {m.norm_placement!r} (OLMo 2 normalizes each sublayer's output: reordered)")
        if m.bias:
            reasons.append("bias=true (OLMo 2's MLP has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return {**self.write_sizes(recipe), **odd_head_dim(recipe), "attention_bias": recipe.model.bias}

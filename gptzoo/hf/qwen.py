"""Qwen2 (Qwen2.5) and Qwen3 checkpoints as Hugging Face stores them (Qwen2ForCausalLM, Qwen3ForCausalLM;
Qwen Team, 2024 and 2025).

Keys, block, RMSNorm and RoPE are Llama's (gptzoo.hf.llama). Qwen2 always has biases on q_proj, k_proj
and v_proj and none on o_proj or the MLP (gptzoo: bias=false and the attention's qkv_bias=true); its
config.json has no attention_bias. Qwen3 has none of those biases (its attention_bias would put one on
q, k, v and o, which gptzoo's bias, covering the MLP too, cannot say) and normalizes each head's query
and key with an RMSNorm of head_dim before RoPE (``self_attn.q_norm``, ``k_norm``; gptzoo's qk_norm
"head"); its head_dim defaults to 128 whatever hidden_size / num_attention_heads is.

Sliding windows (both): only when ``use_sliding_window`` is true (otherwise ``sliding_window`` is
ignored, and transformers writes it as null); then the layers ``layer_types`` names
"sliding_attention" see their last sliding_window keys, and without layer_types the layers from
``max_window_layers`` on. In a recipe, the sliding layers are a layer type "sliding" whose attention
is ``sliding_window`` (``layer_pattern`` lists the full ones as "full"), or [model]'s attention when
every layer slides. Export writes layer_types, and max_window_layers as the first sliding layer (what
transformers 4, which reads no layer_types, needs: exact when the sliding layers are the last ones).
"""

from __future__ import annotations

from typing import Any

from gptzoo.hf.family import Fields, show
from gptzoo.hf.gemma import FULL, SLIDING, one_value
from gptzoo.hf.mistral import LlamaShaped
from gptzoo.recipe import Recipe


class Qwen2(LlamaShaped):
    name = "qwen2"
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    title = "Qwen2"
    implied = {"qkv_bias": True}
    context_default = 32768
    kv_heads_default = 32
    bias_reason = "Qwen2 has biases on q, k and v only: set bias=false and the attention's qkv_bias=true"

    def attention(self, f: Fields) -> dict[str, Any]:
        return {"name": "causal", "qkv_bias": True}

    def layer_windows(self, f: Fields, n_layer: int) -> list[int | None]:
        config = f.config
        window = None
        if f.flag("use_sliding_window", False) and config.get("sliding_window", 4096) is not None:
            window = f.integer("sliding_window", 4096)
        if config.get("layer_types") is None:
            first = self.max_window_layers(f) if window is not None else n_layer
            return [window if i >= first else None for i in range(n_layer)]
        types = f.layer_types(n_layer, (SLIDING, FULL), list)  # a wrong list: a problem, and every layer full
        if window is None and SLIDING in types:
            use, size = show(config.get("use_sliding_window", False)), show(config.get("sliding_window"))
            f.problems.append(
                f"config.json layer_types has {SLIDING!r} layers but no window (use_sliding_window={use}, "
                f"sliding_window={size}; transformers refuses it too): set use_sliding_window to true and "
                f"sliding_window, or make them {FULL!r}"
            )
        return [window if t == SLIDING else None for t in types]

    @staticmethod
    def max_window_layers(f: Fields) -> int:
        """The first sliding layer: an integer >= 0 (0: all of them), by default 28."""
        value = f.config.get("max_window_layers")
        if value is None:
            return 28
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            f.problems.append(f"config.json max_window_layers={show(value)} is not an integer >= 0")
            return 28
        return value

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        fields = super().structure(recipe)
        if recipe.model.head_dim == recipe.model.n_embd // recipe.model.n_head:
            del fields["head_dim"]  # not a Qwen2Config field (transformers reads it when present)
        return fields

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        windows = values["sliding_window"]
        types = [FULL if w is None else SLIDING for w in windows]
        sliding = [i for i, t in enumerate(types) if t == SLIDING]
        return {
            "use_sliding_window": bool(sliding),
            "sliding_window": one_value([w for w in windows if w is not None], "sliding_window", reasons),
            "max_window_layers": sliding[0] if sliding else len(types),
            "layer_types": types,
        }


class Qwen3(Qwen2):
    name = "qwen3"
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    title = "Qwen3"
    implied = {"qk_norm": "head"}
    head_dim_default = 128
    bias_reason = (
        "Qwen3's attention_bias puts biases on q, k, v and o and never on the MLP, and gptzoo's bias covers the MLP too"
    )

    def attention(self, f: Fields) -> dict[str, Any]:
        if f.flag("attention_bias", False):
            f.problems.append(
                "config.json attention_bias=true is not supported (its biases on q, k, v and o but not on the MLP "
                "have no gptzoo equivalent: gptzoo's bias covers the MLP too)"
            )
        return {"name": "causal", "qk_norm": "head"}

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        # head_dim always: Qwen3Config's default is 128, whatever hidden_size / num_attention_heads
        return {**super().structure(recipe), "head_dim": recipe.model.head_dim, "attention_bias": False}

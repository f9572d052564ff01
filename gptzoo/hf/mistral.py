"""Mistral checkpoints as Hugging Face stores them (MistralForCausalLM; Jiang et al., 2023), and what
the Llama-shaped families with sliding windows share (Mistral, Qwen2, Qwen3: transformers derives
all three from Llama's and Mistral's code).

Keys, block, RMSNorm and RoPE are Llama's (gptzoo.hf.llama), with no biases at all. A sliding window
covers every layer whenever config.json's ``sliding_window`` is set: a query sees its last
sliding_window keys (itself included). MistralConfig defaults sliding_window to 4096, so a config.json
without the key has a window, and one without a window must say null (export writes it either way).
MistralForCausalLM ignores ``layer_types`` (it warns) and so does gptzoo. A recipe's window is the
attention's ``window`` (the ``sliding_window`` attention).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.gemma import one_value, shortest_period
from gptzoo.hf.llama import ACTIVATIONS, Llama, rope_position
from gptzoo.recipe import Recipe


def layers_text(indices: list[int]) -> str:
    """``layer 3`` or ``layers 0, 1, 2``, for a message."""
    return f"layer {indices[0]}" if len(indices) == 1 else f"layers {', '.join(map(str, indices))}"


class LlamaShaped(Llama):
    """A Llama-keyed family whose layers may slide: config.json's class defaults (which differ from
    Llama's and from family to family) and each layer's window decide the recipe. Subclasses give the
    attention, how config.json says which layers slide (:meth:`layer_windows`), and the reverse
    (:meth:`layer_config`)."""

    layout = "llama"
    per_layer = frozenset({"sliding_window"})
    context_default: int
    """transformers' max_position_embeddings when config.json has none."""
    kv_heads_default: int
    """transformers' num_key_value_heads when config.json has none (null means one per query head)."""
    head_dim_default: int | None = None
    """transformers' head_dim when config.json has none; None: hidden_size / num_attention_heads."""
    bias_reason: str
    """Why the recipe's bias=true has no equivalent here."""

    def attention(self, f: Fields) -> dict[str, Any]:
        """The attention of full-attention layers (a sliding layer's adds a window)."""
        raise NotImplementedError

    def layer_windows(self, f: Fields, n_layer: int) -> list[int | None]:
        """Each layer's sliding window (None: full attention), as transformers reads config.json."""
        raise NotImplementedError

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        n_embd, n_head, n_layer = (
            f.integer("hidden_size"),
            f.integer("num_attention_heads"),
            f.integer("num_hidden_layers"),
        )
        head_dim = f.integer("head_dim", self.head_dim_default or n_embd // n_head)
        context_length = f.integer("max_position_embeddings", self.context_default)
        attention = self.attention(f)
        model: dict[str, Any] = {
            "vocab_size": f.integer("vocab_size"),
            "context_length": context_length,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_kv_head": self.kv_heads(f, n_head),
            "n_embd": n_embd,
            **({"head_dim": head_dim} if head_dim != n_embd // n_head else {}),
            "d_ff": f.integer("intermediate_size"),
            "bias": False,
            "tie_embeddings": f.flag("tie_word_embeddings", False),
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", 1e-6)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": "gated",
            "position": rope_position(f, context_length),
            "attention": attention,
            "init_std": f.number("initializer_range", 0.02),
        }
        model.update(schedule(self.layer_windows(f, n_layer), attention))
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def kv_heads(self, f: Fields, n_head: int) -> int:
        """num_key_value_heads: the class default when absent, one per query head when null."""
        if "num_key_value_heads" not in f.config:
            return self.kv_heads_default
        return f.integer("num_key_value_heads", n_head)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        reasons = super().structural_reasons(recipe)
        return reasons + ([f"bias=true ({self.bias_reason})"] if recipe.model.bias else [])

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        fields = super().structure(recipe)
        del fields["attention_bias"], fields["mlp_bias"]  # Llama's; these families have their own rules
        return fields


def schedule(windows: list[int | None], attention: dict[str, Any]) -> dict[str, Any]:
    """[model] entries for each layer's window: none; every layer's in [model]'s attention; or a
    layer_pattern of "full" and "sliding" layers (the shortest repeating run of them)."""
    if all(w is None for w in windows):
        return {}
    window = next(w for w in windows if w is not None)
    sliding = {**attention, "name": "sliding_window", "window": window}
    if None not in windows:
        return {"attention": sliding}
    pattern = shortest_period(["full" if w is None else "sliding" for w in windows])
    return {"layer_pattern": pattern, "layer_types": {"sliding": {"attention": sliding}, "full": {}}}


class Mistral(LlamaShaped):
    name = "mistral"
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    title = "Mistral"
    context_default = 4096 * 32
    kv_heads_default = 8
    bias_reason = "Mistral has no biases"

    def attention(self, f: Fields) -> dict[str, Any]:
        return {"name": "causal"}

    def layer_windows(self, f: Fields, n_layer: int) -> list[int | None]:
        if "sliding_window" in f.config and f.config["sliding_window"] is None:
            windows: list[int | None] = [None] * n_layer
        else:
            windows = [f.integer("sliding_window", 4096)] * n_layer  # MistralConfig's default when absent
        types = f.config.get("layer_types")
        implied = ["full_attention" if w is None else "sliding_attention" for w in windows]
        if types is not None and types != implied:
            # MistralForCausalLM masks every layer alike, while its cache follows layer_types: no one model
            f.problems.append(
                f"config.json layer_types={show(types)} is not supported for Mistral (MistralForCausalLM slides "
                "every layer when sliding_window is set and none otherwise); remove layer_types, or use a "
                "family with alternating attention (Qwen2, Gemma)"
            )
        return windows

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        windows = values["sliding_window"]
        full = [i for i, w in enumerate(windows) if w is None]
        if len(full) == len(windows):
            return {"sliding_window": None}  # explicitly: MistralConfig would default it to 4096
        if full:
            reasons.append(
                f"no sliding window on {layers_text(full)}, one on the others (Mistral slides every layer or none)"
            )
        return {"sliding_window": one_value([w for w in windows if w is not None], "sliding_window", reasons)}

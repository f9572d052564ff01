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
    eps_default: float = 1e-6
    """transformers' rms_norm_eps when config.json has none."""
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

    def mlp(self, f: Fields) -> str | dict[str, Any]:
        """The mlp of the layers (those of :meth:`dense_layers` aside)."""
        return "gated"

    def dense_layers(self, f: Fields, n_layer: int) -> list[bool]:
        """Which layers have the gated MLP of intermediate_size instead of :meth:`mlp` (an MoE family's
        layers without experts); none by default."""
        return [False] * n_layer

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, n_layer = sizes["n_embd"], sizes["n_head"], sizes["n_layer"]
        head_dim = f.integer("head_dim", self.head_dim_default or n_embd // n_head)
        attention = self.attention(f)
        model: dict[str, Any] = {
            **sizes,
            **({"head_dim": head_dim} if head_dim != n_embd // n_head else {}),
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": f.number("rms_norm_eps", self.eps_default)},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": self.mlp(f),
            "position": rope_position(f, sizes["context_length"]),
            "attention": attention,
        }
        model.update(schedule(model, self.layer_windows(f, n_layer), self.dense_layers(f, n_layer)))
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    @property
    def size_defaults(self) -> Mapping[str, Any]:  # type: ignore[override]
        """The class's defaults: max_position_embeddings, and num_key_value_heads (one per query head when
        config.json has null)."""
        return {"context_length": self.context_default, "n_kv_head": self._kv_heads}

    def _kv_heads(self, read: Mapping[str, Any], config: Mapping[str, Any]) -> int:
        return read["n_head"] if "num_key_value_heads" in config else self.kv_heads_default

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        reasons = super().structural_reasons(recipe)
        return reasons + ([f"bias=true ({self.bias_reason})"] if recipe.model.bias else [])

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        fields = super().structure(recipe)
        del fields["attention_bias"], fields["mlp_bias"]  # Llama's; these families have their own rules
        return fields


def schedule(model: dict[str, Any], windows: list[int | None], dense: list[bool]) -> dict[str, Any]:
    """[model] entries for each layer's window and mlp (``dense``: the gated MLP instead of [model]'s
    mlp): what every layer shares in [model] itself, and what varies as a layer_pattern (the shortest
    repeating run) of layer types named by what they change: "sliding" or "full" attention, a "dense"
    or "moe" mlp (both, joined by "_", when both vary)."""
    out: dict[str, Any] = {}
    window = next((w for w in windows if w is not None), None)
    sliding = {**model["attention"], "name": "sliding_window", "window": window}
    if None not in windows:
        out["attention"] = sliding
    if all(dense):
        out["mlp"] = "gated"
    vary_attention, vary_mlp = len(set(w is None for w in windows)) > 1, len(set(dense)) > 1
    if not (vary_attention or vary_mlp):
        return out
    types: dict[str, dict[str, Any]] = {}
    names = []
    for w, d in zip(windows, dense, strict=True):
        parts = ([("full",) if w is None else ("sliding", {"attention": sliding})] if vary_attention else []) + (
            [("dense", {"mlp": "gated"}) if d else ("moe",)] if vary_mlp else []
        )
        name = "_".join(part[0] for part in parts)
        types.setdefault(name, {k: v for part in parts for k, v in (part[1] if len(part) > 1 else {}).items()})
        names.append(name)
    return {**out, "layer_pattern": shortest_period(names), "layer_types": types}


class Mistral(LlamaShaped):
    name = "mistral"
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    title = "Mistral"
    context_default = 4096 * 32
    kv_heads_default = 8
    bias_reason = "Mistral has no biases"
    window_default: int | None = 4096
    """transformers' sliding_window when config.json has none."""

    def attention(self, f: Fields) -> dict[str, Any]:
        return {"name": "causal"}

    def layer_windows(self, f: Fields, n_layer: int) -> list[int | None]:
        if f.config.get("sliding_window", self.window_default) is None:
            windows: list[int | None] = [None] * n_layer
        else:
            windows = [f.integer("sliding_window", self.window_default)] * n_layer  # the class default when absent
        types = f.config.get("layer_types")
        implied = ["full_attention" if w is None else "sliding_attention" for w in windows]
        if types is not None and types != implied:
            # it masks every layer alike, while its cache follows layer_types: no one model
            f.problems.append(
                f"config.json layer_types={show(types)} is not supported for {self.title} ({self.architecture} slides "
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
                f"no sliding window on {layers_text(full)}, one on the others ({self.title} slides every layer or none)"
            )
        return {"sliding_window": one_value([w for w in windows if w is not None], "sliding_window", reasons)}

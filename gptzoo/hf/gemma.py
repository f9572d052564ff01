"""Gemma 2 and Gemma 3 (text) checkpoints as Hugging Face stores them (Gemma2ForCausalLM,
Gemma3ForCausalLM; Gemma Team, 2024 and 2025).

Keys as Llama's (``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, ``model.norm``), with four norms a layer (sandwich:
``input_layernorm`` > attention > ``post_attention_layernorm``, ``pre_feedforward_layernorm`` > mlp >
``post_feedforward_layernorm``) whose weights are offsets from 1 (gptzoo's gemma_rmsnorm), token
embeddings scaled by sqrt(hidden_size), scores scaled by query_pre_attn_scalar^-1/2, and layer types
(``layer_types``: "sliding_attention" layers see ``sliding_window`` keys). Gemma 3 adds a per-head
q_norm/k_norm and a RoPE theta per layer type (``rope_parameters``: sliding_attention,
full_attention); Gemma 2 has one RoPE, and soft-caps attention scores (attn_logit_softcapping,
which Gemma 3 ignores) and final logits (final_logit_softcapping).

In a recipe the layer types are ``sliding`` and ``full``: ``layer_pattern`` is the shortest
repeating run of config.json's layer_types, [model] holds the full-attention layers' components and
``[model.layer_types.sliding]`` the sliding ones' attention (and for Gemma 3 its RoPE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.llama import ACTIVATIONS, PREFIX, Llama, rope_position
from gptzoo.recipe import Recipe

SLIDING, FULL = "sliding_attention", "full_attention"
"""transformers' layer types."""
NORMS = {
    "ln_1": "input_layernorm",
    "post_ln_1": "post_attention_layernorm",
    "ln_2": "pre_feedforward_layernorm",
    "post_ln_2": "post_feedforward_layernorm",
}
"""gptzoo's sandwich block norms -> Gemma's."""


def shortest_period(items: Sequence[str]) -> list[str]:
    """The shortest prefix whose repetition (cut at the end) gives ``items``."""
    for n in range(1, len(items) + 1):
        if all(items[i] == items[i % n] for i in range(len(items))):
            return list(items[:n])
    return list(items)


def one_value(values: Sequence[Any], what: str, reasons: list[str]) -> Any:
    """The value every entry shares (None when there are none), or a reason when they differ."""
    distinct = list(dict.fromkeys(repr(v) for v in values))
    if len(distinct) > 1:
        reasons.append(f"{what} differs between layers ({', '.join(distinct)}); the family has one")
    return values[0] if values else None


class Gemma(Llama):
    """What Gemma 2 and 3 share; subclasses say how RoPE and the attention are configured. Their
    checkpoints are Llama's with four norms a layer."""

    block_parts = {**NORMS, "attn": "self_attn", "mlp": "mlp"}
    layout = "llama"
    ignored_tensors = (".rotary_emb.inv_freq",)
    required = {"rms_norm_eps": "norm", "hidden_activation": "activation"}
    known = frozenset({"partial_rotary_factor"})
    size_defaults = {"context_length": 8192, "tie_embeddings": True}
    renames = {"hidden_act": "hidden_activation"}
    implied: Mapping[str, Any] = {"rms_norm_offset": 1.0}
    per_layer = frozenset({"sliding_window", "rope_theta", "rope_scaling", "query_pre_attn_scalar"})
    embedding = PREFIX + "embed_tokens.weight"
    default_pattern = 2
    """Without layer_types, layer i is full when (i + 1) % sliding_window_pattern == 0."""

    def attention(self, f: Fields, scale: float) -> dict[str, Any]:
        """The [model] attention (the full-attention layers')."""
        raise NotImplementedError

    def positions(self, f: Fields, context_length: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The full layers' RoPE and, when it differs, the sliding layers'."""
        raise NotImplementedError

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_embd, n_head, n_layer = sizes["n_embd"], sizes["n_head"], sizes["n_layer"]
        head_dim = f.integer("head_dim", n_embd // n_head)
        context_length = sizes["context_length"]
        scale = f.number("query_pre_attn_scalar", 256.0) ** -0.5
        types = self.layer_types(f, config, n_layer)
        window = f.integer("sliding_window", 4096)
        if "sliding_window" in config and config["sliding_window"] is None and SLIDING in types:
            f.problems.append(
                "config.json sliding_window=None, but layer_types has sliding_attention layers; give the window "
                "(a number of keys) or make every layer full_attention"
            )
        full_position, sliding_position = self.positions(f, context_length)
        attention = self.attention(f, scale)
        model: dict[str, Any] = {
            **sizes,
            **({"head_dim": head_dim} if head_dim * n_head != n_embd else {}),
            "bias": f.flag("attention_bias", False),
            "scale_embeddings": True,
            "logit_softcap": f.number("final_logit_softcapping", 0.0) if config.get("final_logit_softcapping") else 0.0,
            "norm": {"name": "gemma_rmsnorm", "eps": f.number("rms_norm_eps", 1e-6)},
            "norm_placement": "sandwich",
            "activation": f.choice("hidden_activation", "gelu_pytorch_tanh", ACTIVATIONS),
            "mlp": "gated",
            "position": full_position,
            "attention": attention,
        }
        if len(set(types)) > 1 or SLIDING in types:
            pattern = ["sliding" if t == SLIDING else "full" for t in shortest_period(types)]
            sliding: dict[str, Any] = {"attention": {**attention, "name": "sliding_window", "window": window}}
            if sliding_position is not None:
                sliding["position"] = sliding_position
            layer_types: dict[str, Any] = {"sliding": sliding}
            if "full" in pattern:
                layer_types["full"] = {}
            model.update(layer_pattern=pattern, layer_types=layer_types)
        if config.get("attention_bias") and f.flag("attention_bias", False):
            f.problems.append("config.json attention_bias=true is not supported (gptzoo's Gemma has no biases)")
        f.problems += refuse(config, {"use_bidirectional_attention": False})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def layer_types(self, f: Fields, config: Mapping[str, Any], n_layer: int) -> list[str]:
        def every() -> list[str]:
            n = f.integer("sliding_window_pattern", self.default_pattern)
            return [FULL if (i + 1) % n == 0 else SLIDING for i in range(n_layer)]

        return f.layer_types(n_layer, (SLIDING, FULL), every)

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "sandwich":
            reasons.append(f"norm_placement {m.norm_placement!r} ({self.title} has sandwich norms)")
        if not m.scale_embeddings:
            reasons.append(f"scale_embeddings=false ({self.title} scales its embeddings by sqrt(n_embd))")
        return reasons

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        m = recipe.model
        return {
            **self.write_sizes(recipe),
            "head_dim": m.head_dim,
            "attention_bias": m.bias,
            "final_logit_softcapping": m.logit_softcap or None,
        }

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        windows = values["sliding_window"]
        types = [FULL if w is None else SLIDING for w in windows]
        config: dict[str, Any] = {"layer_types": types}
        window = one_value([w for w in windows if w is not None], "sliding_window", reasons)
        if window is not None:
            config["sliding_window"] = window
        scalar = one_value(values["query_pre_attn_scalar"], "query_pre_attn_scalar", reasons)
        config["query_pre_attn_scalar"] = scalar if scalar is not None else recipe.model.head_dim
        rope = {
            t: {
                "rope_theta": one_value(
                    [v for v, k in zip(values["rope_theta"], types, strict=True) if k == t], "rope_theta", reasons
                ),
                "scaling": one_value(
                    [v for v, k in zip(values["rope_scaling"], types, strict=True) if k == t], "rope_scaling", reasons
                ),
            }
            for t in (SLIDING, FULL)
        }
        return {**config, **self.rope_config(rope, reasons)}

    def rope_config(self, rope: dict[str, dict[str, Any]], reasons: list[str]) -> dict[str, Any]:
        """config.json's RoPE fields from each layer type's rope_theta and scaling (None: no layer of that type)."""
        raise NotImplementedError


class Gemma3(Gemma):
    name = "gemma3_text"
    model_type = "gemma3_text"
    architecture = "Gemma3ForCausalLM"
    title = "Gemma 3"
    implied = {"rms_norm_offset": 1.0, "qk_norm": "head"}
    default_pattern = 6

    def attention(self, f: Fields, scale: float) -> dict[str, Any]:
        return {"name": "causal", "qk_norm": "head", "scale": scale}

    def positions(self, f: Fields, context_length: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        parameters = f.mapping("rope_parameters")
        if SLIDING in parameters or FULL in parameters:  # transformers 5: a table per layer type
            tables = {}
            for t in (SLIDING, FULL):
                table = parameters.get(t, {})
                if not isinstance(table, dict):
                    f.problems.append(f"config.json rope_parameters.{t}={show(table)} is not an object")
                    table = {}
                tables[t] = table
            full = rope_position(f, context_length, parameters=tables[FULL], scaling=tables[FULL])
            sliding = rope_position(f, context_length, parameters=tables[SLIDING], scaling=tables[SLIDING])
        elif parameters:
            f.problems.append(
                f"config.json rope_parameters={show(parameters)} is one table; Gemma 3 has one per layer type "
                f'({{"{SLIDING}": {{...}}, "{FULL}": {{...}}}}), or the older rope_theta and rope_local_base_freq'
            )
            full = sliding = {"name": "rope"}
        else:  # transformers 4: rope_theta (+ rope_scaling) for full layers, rope_local_base_freq for sliding ones
            full = rope_position(f, context_length)
            sliding = {"name": "rope", "theta": f.number("rope_local_base_freq", 10000.0)}
        return full, sliding

    def rope_config(self, rope: dict[str, dict[str, Any]], reasons: list[str]) -> dict[str, Any]:
        parameters = {}
        for t, default in ((SLIDING, 10000.0), (FULL, 1000000.0)):
            theta, scaling = rope[t]["rope_theta"], rope[t]["scaling"] or {}
            parameters[t] = {"rope_type": "default", **scaling, "rope_theta": theta if theta is not None else default}
        return {"rope_parameters": parameters}


class Gemma2(Gemma):
    name = "gemma2"
    model_type = "gemma2"
    architecture = "Gemma2ForCausalLM"
    title = "Gemma 2"
    per_layer = Gemma.per_layer | {"attn_logit_softcapping"}

    def attention(self, f: Fields, scale: float) -> dict[str, Any]:
        softcap = f.number("attn_logit_softcapping", 50.0) if f.config.get("attn_logit_softcapping", 50.0) else 0.0
        return {"name": "causal", "scale": scale, **({"softcap": softcap} if softcap else {})}

    def positions(self, f: Fields, context_length: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return rope_position(f, context_length), None

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        softcap = one_value(values["attn_logit_softcapping"], "attn_logit_softcapping", reasons)
        return {**super().layer_config(recipe, values, reasons), "attn_logit_softcapping": softcap}

    def rope_config(self, rope: dict[str, dict[str, Any]], reasons: list[str]) -> dict[str, Any]:
        present = [rope[t] for t in (SLIDING, FULL) if rope[t]["rope_theta"] is not None]
        if len(present) == 2 and present[0] != present[1]:
            reasons.append("the sliding and full layers' RoPE differ (Gemma 2 has one)")
        theta = present[0]["rope_theta"] if present else 10000.0
        scaling = present[0]["scaling"] if present else None
        return {"rope_theta": theta, **({"rope_scaling": scaling} if scaling else {})}

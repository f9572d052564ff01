"""SmolLM3 checkpoints as Hugging Face stores them (SmolLM3ForCausalLM; Hugging Face, 2025): Llama's model,
keys and numerics, with RoPE on some layers only.

``no_rope_layers`` holds a 1 for each layer that rotates its queries and keys and a 0 for one that uses no
positions at all (NoPE; by default every ``no_rope_layer_interval``-th layer, the 4th, 8th, ...). In a recipe
the layer types are ``rope`` and ``nope``: [model] holds the RoPE layers' components (its position the rope of
``rope_theta``) and ``[model.layer_types.nope]`` the position ``none``. The sliding window SmolLM3 can put on
its NoPE layers (``use_sliding_window``) is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, show
from gptzoo.hf.gemma import shortest_period
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import ROPE_TYPES, Llama, rope_fields
from gptzoo.recipe import Recipe

USE_ROPE = "use_rope"
"""The per-layer field each layer's position gives in the "smollm3" layout: 1 with RoPE, 0 without."""


def _rope_fields(rope_type: str) -> Any:
    """A rope position's fields as Llama writes them, and that its layers use RoPE."""
    fields = rope_fields("rope_theta", "partial_rotary_factor")(rope_type)
    return lambda position: {**fields(position), USE_ROPE: 1}


LAYOUT = (
    *(builtin(t.component, "smollm3", lambda position: [], _rope_fields(name)) for name, t in ROPE_TYPES.items()),
    builtin("gptzoo_plugins._positions:NoPosition", "smollm3", lambda position: [], lambda position: {USE_ROPE: 0}),
)
"""The "smollm3" layout of the built-in positions; every other component is mapped as Llama maps it."""


class SmolLM3(Llama):
    name = "smollm3"
    model_type = "smollm3"
    architecture = "SmolLM3ForCausalLM"
    title = "SmolLM3"
    layout = "smollm3"
    extends = Llama()
    component_layouts = LAYOUT
    per_layer = frozenset({USE_ROPE})
    size_defaults = {"context_length": 32768, "tie_embeddings": True}

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        data = super().recipe_data(
            {k: v for k, v in config.items() if k not in ("no_rope_layers", "use_sliding_window")}
        )
        f = Fields(config)
        n_layer = data["model"]["n_layer"]
        uses = config.get("no_rope_layers")
        if uses is None:
            every = f.integer("no_rope_layer_interval", 4)
            uses = [int((i + 1) % every != 0) for i in range(n_layer)]
        elif (
            not isinstance(uses, list) or len(uses) != n_layer or not all(u in (0, 1) and type(u) is int for u in uses)
        ):
            f.problems.append(f"config.json no_rope_layers={show(uses)} is not a list of {n_layer} 0s and 1s")
            uses = [1] * n_layer
        if config.get("use_sliding_window") and f.flag("use_sliding_window", False):
            f.problems.append(
                "config.json use_sliding_window=true is not supported (gptzoo's SmolLM3 attends to every key)"
            )
        f.check()
        if 0 in uses:
            pattern = shortest_period(["rope" if u else "nope" for u in uses])
            layer_types: dict[str, Any] = {"nope": {"position": "none"}}
            if "rope" in pattern:
                layer_types["rope"] = {}
            data["model"].update(layer_pattern=pattern, layer_types=layer_types)
        return data

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        # SmolLM3Config's default pad_token_id, 128004, is no token of a smaller vocabulary (transformers would
        # not build the model)
        return {**super().structure(recipe), "pad_token_id": None}

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        return {"no_rope_layers": values[USE_ROPE]}

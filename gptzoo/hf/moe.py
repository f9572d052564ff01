"""What the mixture-of-experts families share (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss): where the experts'
tensors go, which config.json fields describe the routing, and which layers have experts.

gptzoo's mixture of experts (the ``moe`` mlp, plugins/_moe.py) keeps the router as ``router``, expert e
as ``experts.e`` (``c_fc`` = [gate; up], ``c_proj``), the shared expert as ``shared`` and its gate as
``shared_gate``; a family stores them under its own names (:func:`expert_maps`). transformers 5 holds
the experts of a layer as two 3-D tensors in memory, but reads and writes checkpoints with one tensor
per expert and projection, as below.

Routing on export (:func:`moe_config`): each feature of the component is written under the family's
field for it; a feature the family has no field for must have the value the family's rule gives it
(Mixtral always renormalizes the top-k weights), else it is written under its own name, which the family
then refuses as a field it has no place for, naming it. On import (:func:`moe_component`) the family's
fields give the component's parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gptzoo.class_table import Row
from gptzoo.hf.family import Fields, show
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import kinds
from gptzoo.hf.mistral import layers_text
from gptzoo.hf.tensor_map import TensorMap

MOE = "gptzoo_plugins._moe:MixtureOfExperts"
"""The reference of gptzoo's mixture of experts."""
MOE_LAYER = "moe_layer"
"""The per-layer field an expert layer's config gives (families put it in ``per_layer``; never written)."""

FEATURES: dict[str, Any] = {
    "normalize": True,
    "scoring": "softmax",
    "routed_scale": 1.0,
    "groups": 1,
    "group_top_k": 1,
    "group_score": "max",
    "score_bias": False,
    "router_bias": False,
    "shared_ff": 0,
    "shared_gate": False,
    "gated": True,
    "expert_bias": False,
    "glu_limit": 0.0,
    "own_width": False,
}
"""The routing features a family may lack a field for, with the value a family without one has unless
its rules say otherwise (own_width: the experts are not d_ff wide, which a family that sizes them by
intermediate_size cannot say)."""


def features(moe: Any) -> dict[str, Any]:
    """The component's routing features (FEATURES' keys, and experts, top_k, expert_ff)."""
    router = moe.router
    return {
        "experts": len(moe.experts),
        "top_k": moe.top_k,
        "expert_ff": moe.expert_ff,
        "normalize": router.normalize,
        "scoring": router.scoring,
        "routed_scale": router.routed_scale,
        "groups": router.groups,
        "group_top_k": router.group_top_k if router.groups > 1 else 1,
        "group_score": router.group_score if router.groups > 1 else "max",
        "score_bias": router.score_bias is not None,
        "router_bias": router.bias is not None,
        "shared_ff": moe.shared.c_proj.in_features if moe.shared is not None else 0,
        "shared_gate": moe.shared_gate is not None,
        "gated": moe.experts[0].gated,
        "expert_bias": moe.experts[0].c_fc.bias is not None,
        "glu_limit": moe.experts[0].limit,
        "own_width": moe.expert_ff != moe.d_ff,
    }


def moe_config(moe: Any, names: Mapping[str, str], rules: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config.json fields of an expert layer: each feature in ``names`` under the family's field
    for it; each other feature that departs from the family's ``rules`` (by default FEATURES') under
    its own name, for the family to refuse; and the per-layer MOE_LAYER."""
    rules = {**FEATURES, **(rules or {})}
    fields: dict[str, Any] = {MOE_LAYER: True}
    for feature, value in features(moe).items():
        if feature in names:
            fields[names[feature]] = value
        elif feature in rules and value != rules[feature]:
            fields[feature] = value
    return fields


def expert_maps(
    moe: Any,
    *,
    router: str = "gate",
    projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    shared: str = "shared_expert",
    shared_gate: str = "shared_expert_gate",
) -> list[TensorMap]:
    """The expert layer's tensors: the router's weight (and bias) as ``router``, expert e's c_fc as its
    gate and up projections and c_proj as its down projection (``projections``, under ``experts.e.``),
    the shared expert's likewise under ``shared``, its gate as ``shared_gate``."""
    gate, up, down = projections

    def mlp(ours: str, theirs: str, expert: Any) -> list[TensorMap]:
        ff = expert.c_proj.in_features
        fc = (
            [
                TensorMap(f"{ours}c_fc.{k}", (f"{theirs}{gate}.{k}", f"{theirs}{up}.{k}"), sizes=(ff, ff))
                for k in kinds(expert.c_fc)
            ]
            if expert.gated
            else [TensorMap(f"{ours}c_fc.{k}", (f"{theirs}{up}.{k}",)) for k in kinds(expert.c_fc)]
        )
        return fc + [TensorMap(f"{ours}c_proj.{k}", (f"{theirs}{down}.{k}",)) for k in kinds(expert.c_proj)]

    maps = [TensorMap(f"router.{k}", (f"{router}.{k}",)) for k in kinds(moe.router)]
    if moe.router.score_bias is not None:
        maps.append(TensorMap("router.score_bias", (f"{router}.e_score_correction_bias",)))
    for e, expert in enumerate(moe.experts):
        maps += mlp(f"experts.{e}.", f"experts.{e}.", expert)
    if moe.shared is not None:
        maps += mlp("shared.", f"{shared}.", moe.shared)
    if moe.shared_gate is not None:
        maps.append(TensorMap("shared_gate.weight", (f"{shared_gate}.weight",)))
    return maps


def moe_layout(layout: str, weights: Any, config: Any) -> Row:
    """The built-in mixture of experts' layout in ``layout``."""
    return builtin(MOE, layout, weights, config)


def moe_component(
    f: Fields,
    *,
    experts: str,
    experts_default: int,
    top_k_default: int,
    aliases: tuple[str, ...] = (),
    expert_ff: int | None = None,
    **fixed: Any,
) -> dict[str, Any]:
    """The ``moe`` mlp of a config.json: ``experts`` names its expert-count field (or one of ``aliases``,
    the names transformers' attribute_map also reads), num_experts_per_tok its top-k (refused above the
    expert count), each with the family's default; ``expert_ff`` the experts' width when it is not d_ff;
    ``fixed`` the family's other parameters."""
    key = next((name for name in (experts, *aliases) if f.config.get(name) is not None), experts)
    n = f.integer(key, experts_default)
    top_k = f.integer("num_experts_per_tok", top_k_default)
    if top_k > n:
        f.problems.append(
            f"config.json num_experts_per_tok={top_k} is more than the {n} experts of {key}; it must be "
            f"between 1 and {n}"
        )
    component: dict[str, Any] = {"name": "moe", "experts": n, "top_k": min(top_k, n)}
    if expert_ff is not None:
        component["expert_ff"] = expert_ff
    return {**component, **fixed}


def sparse_layers(f: Fields, n_layer: int) -> list[bool]:
    """Which layers have experts, as Qwen2-MoE and Qwen3-MoE decide: those not in mlp_only_layers whose
    index + 1 is a multiple of decoder_sparse_step."""
    step = f.integer("decoder_sparse_step", 1)
    only = f.config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(type(i) is int and 0 <= i < n_layer for i in only):
        f.problems.append(
            f"config.json mlp_only_layers={show(only)} is not a list of layer indices between 0 and {n_layer - 1}"
        )
        only = []
    return [i not in only and (i + 1) % step == 0 for i in range(n_layer)]


def every_layer_sparse(values: Mapping[str, list[Any]], title: str, reasons: list[str]) -> None:
    """A reason when some layer of a family that has experts in every layer has none."""
    dense = [i for i, sparse in enumerate(values[MOE_LAYER]) if not sparse]
    if dense:
        reasons.append(f"no experts on {layers_text(dense)} ({title} has experts in every layer)")


def sparse_config(values: Mapping[str, list[Any]]) -> dict[str, Any]:
    """Qwen-MoE's decoder_sparse_step and mlp_only_layers for the layers that have experts."""
    return {"decoder_sparse_step": 1, "mlp_only_layers": [i for i, s in enumerate(values[MOE_LAYER]) if not s]}

"""OLMo Hybrid against transformers on tiny random checkpoints (tests/hfparity.py): Pre-LN gated DeltaNet layers
between OLMo 2 attention layers whose norms follow each sublayer (a norm placement per layer type), with RoPE or
with no positions (the released checkpoints), at odd shapes and schedules that start and end on either layer type;
the names its checkpoints store; its config fields gptzoo lacks and the recipes it cannot express, refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hfparity import check_family, config_problem, refusal, save_hf
from safetensors.torch import load_file

import gptzoo
from gptzoo.hf import export_hf, load_hf

TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "intermediate_size": 56,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "linear_num_value_heads": 6,
    "linear_num_key_heads": 3,
    "linear_key_head_dim": 10,
    "linear_value_head_dim": 14,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}
"""Odd shapes: 5 query heads of 8 sharing 1 key/value head; 3 key heads of 10 each serving 2 value heads of 14 (so
the q, k and v convolutions are 30, 30 and 84 channels)."""
NOPE = {"rope_type": "default", "rope_theta": None}


@pytest.mark.parametrize(
    ("schedule", "kernel", "rope", "neg_eigval"),
    [
        (
            ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
            3,
            NOPE,
            True,
        ),
        (
            ["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
            4,
            {"rope_type": "default", "rope_theta": 5000.0},
            False,
        ),
    ],
    ids=["attention-first-nope", "deltanet-first-rope"],
)
def test_olmo_hybrid_matches_transformers(
    tmp_path: Path, schedule: list[str], kernel: int, rope: dict, neg_eigval: bool
) -> None:
    config = transformers.OlmoHybridConfig(
        **TINY,
        layer_types=schedule,
        linear_conv_kernel_dim=kernel,
        rope_parameters=rope,
        linear_allow_neg_eigval=neg_eigval,
    )
    path = save_hf(tmp_path, "olmo_hybrid", config)
    derived = check_family(path, length=21)
    m = derived.model
    assert m.schedule() == ["linear" if t == "linear_attention" else "full" for t in schedule]
    assert [m.placement(t) for t in m.schedule()] == [
        "pre" if t == "linear_attention" else "reordered" for t in schedule
    ]
    assert m.position.name == ("none" if rope is NOPE else "rope")
    assert dict(m.layer_components("linear")["attention"].params)["neg_eigval"] is neg_eigval
    exported = json.loads((tmp_path / "olmo_hybrid-export" / "config.json").read_text())
    assert (exported["model_type"], exported["layer_types"], exported["rope_parameters"]["rope_theta"]) == (
        "olmo_hybrid",
        schedule,
        rope["rope_theta"],
    )


def test_the_checkpoint_names_are_the_released_ones_and_the_convolutions_split_by_their_sizes(tmp_path: Path) -> None:
    """transformers 5.25 saves the q, k and v convolutions as three equal thirds of their concatenation (48 rows
    each of 144); gptzoo reads them by concatenating, as transformers does, and exports 30, 30 and 84 rows, with the
    norms under the names the checkpoints keep (attention_layer_norm, feedforward_layer_norm)."""
    layer_types = ["linear_attention", "full_attention"]
    config = transformers.OlmoHybridConfig(**{**TINY, "num_hidden_layers": 2}, layer_types=layer_types)
    path = save_hf(tmp_path, "olmo_hybrid", config)
    saved = load_file(path / "model.safetensors")
    assert [saved[f"model.layers.0.linear_attn.{x}_conv1d.weight"].shape[0] for x in "qkv"] == [48, 48, 48]
    model = load_hf(path)
    export_hf(model, tmp_path / "out")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert [written[f"model.layers.0.linear_attn.{x}_conv1d.weight"].shape[0] for x in "qkv"] == [30, 30, 84]
    assert torch.equal(
        torch.cat([written[f"model.layers.0.linear_attn.{x}_conv1d.weight"] for x in "qkv"]),
        torch.cat([saved[f"model.layers.0.linear_attn.{x}_conv1d.weight"] for x in "qkv"]),
    )
    norms = sorted(k.split(".")[3] for k in written if k.startswith("model.layers.") and "layer" in k.split(".")[3])
    assert norms == [
        "attention_layer_norm",
        "feedforward_layer_norm",
        "feedforward_layer_norm",
        "post_feedforward_layernorm",
    ]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"num_hidden_layers": 2, "layer_types": ["linear_attention"] * 2},
            "config.json layer_types=['linear_attention', 'linear_attention'] has no 'full_attention' layer (OLMo "
            "Hybrid has both)",
        ),
        (
            {"linear_num_key_heads": 4},
            "config.json linear_num_value_heads=6 is not a multiple of linear_num_key_heads=4 (each key head serves "
            "as many value heads)",
        ),
        (
            {"attention_bias": True},
            "config.json attention_bias=true is not supported (OLMo Hybrid's MLP and DeltaNet have no biases, and "
            "gptzoo's bias covers them all)",
        ),
        ({"linear_conv_kernel_dim": 0}, "config.json linear_conv_kernel_dim=0 is not a positive integer"),
    ],
    ids=["no-attention", "heads-do-not-divide", "attention-bias", "no-taps"],
)
def test_olmo_hybrid_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "olmo_hybrid", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ["model.layer_types.linear.norm_placement=reordered"],
            "layer 0 (linear_attention) has norm_placement 'reordered' (OLMo Hybrid's attention layers are "
            "'reordered', its DeltaNet layers 'pre')",
        ),
        (
            ["model.attention={name='causal', qk_norm='head'}"],
            "layer 3's attention has qk_norm 'head' (OLMo Hybrid normalizes the whole q and k projections: 'full')",
        ),
        (
            ["model.layer_types.linear.attention.norm_eps=1e-6"],
            "attention 'gated_deltanet' sets linear_norm_eps=1e-06, which OlmoHybridForCausalLM has no field for",
        ),
        (
            ["model.position={name='rope', theta=1e4}"],
            "OlmoHybridForCausalLM implies rope_rotate_in_float32=True, which no component gives",
        ),
    ],
    ids=["deltanet-reordered", "per-head-qk-norm", "output-norm-eps", "rope-in-activation-dtype"],
)
def test_recipes_olmo_hybrid_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    assert (
        refusal("olmo-hybrid-tiny", overrides, "olmo_hybrid")
        == f"recipe 'olmo-hybrid-tiny' has no Hugging Face OLMo Hybrid equivalent: {reasons}"
    )


def test_a_family_that_places_every_layer_alike_refuses_a_layer_type_placed_otherwise() -> None:
    assert refusal("qwen3.5-tiny", ["model.layer_types.linear.norm_placement=sandwich"], "qwen3_5_text") == (
        "recipe 'qwen3.5-tiny' has no Hugging Face Qwen3.5 equivalent: layer type 'linear' has norm_placement "
        "'sandwich' (Qwen3.5 places every layer's norms alike)"
    )


def test_the_tiny_recipe_round_trips_through_its_export(tmp_path: Path) -> None:
    recipe = gptzoo.load_recipe("olmo-hybrid-tiny")
    export_hf(gptzoo.build_model(recipe), tmp_path)
    again = gptzoo.hf.hf_recipe(tmp_path)
    assert again.model == recipe.model

"""Granite 4.0-H against transformers on tiny random checkpoints (tests/hfparity.py): Mamba-2 layers between
attention layers, Granite's multipliers (embeddings, residual branches, attention scale, logits), a shared MLP
alone or beside stacked experts, with no positions (the released checkpoints) or RoPE, at odd shapes and schedules
that start and end on either layer type; the legacy layer type names; config fields gptzoo lacks and recipes it
cannot express, refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from hfparity import check_family, config_problem, refusal, save_hf

import gptzoo
from gptzoo.hf import export_hf, hf_recipe

TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "shared_intermediate_size": 56,
    "intermediate_size": 24,
    "mamba_n_heads": 10,
    "mamba_n_groups": 2,
    "mamba_d_state": 6,
    "mamba_expand": 2,
    "mamba_chunk_size": 4,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.05,
    "logits_scaling": 3.0,
    "pad_token_id": 0,
}
"""Odd shapes: 5 query heads of 8 sharing 1 key/value head; 10 Mamba-2 heads of 8 channels in 2 groups of state 6
(so B and C are each shared by 5 heads); Granite-like multipliers."""


@pytest.mark.parametrize(
    ("schedule", "extra", "expected_mlp"),
    [
        (
            ["attention", "mamba", "mamba", "attention", "mamba"],
            {"num_local_experts": 0, "position_embedding_type": "nope", "mamba_d_conv": 3},
            "gated",
        ),
        (
            ["mamba", "mamba", "attention", "mamba", "attention"],
            {"num_local_experts": 4, "num_experts_per_tok": 2, "position_embedding_type": "rope", "mamba_d_conv": 4},
            "moe",
        ),
    ],
    ids=["attention-first-dense-nope", "mamba-first-experts-rope"],
)
def test_granite_hybrid_matches_transformers(
    tmp_path: Path, schedule: list[str], extra: dict, expected_mlp: str
) -> None:
    config = transformers.GraniteMoeHybridConfig(**TINY, **extra, layer_types=schedule)
    path = save_hf(tmp_path, "granitemoehybrid", config)
    derived = check_family(path, length=21)
    m = derived.model
    assert m.schedule() == ["mamba" if t == "mamba" else "full" for t in schedule]
    assert (m.mlp.name, m.position.name) == (
        expected_mlp,
        "rope" if extra["position_embedding_type"] == "rope" else "none",
    )
    assert (m.embedding_multiplier, m.residual_multiplier, m.logits_scaling) == (12.0, 0.22, 3.0)
    assert dict(m.attention.params)["scale"] == 0.05


def test_the_tiny_recipe_round_trips_through_its_export(tmp_path: Path) -> None:
    recipe = gptzoo.load_recipe("granite-4.0-h-tiny")
    export_hf(gptzoo.build_model(recipe), tmp_path)
    assert hf_recipe(tmp_path).model == recipe.model
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["mamba_expand"], written["shared_intermediate_size"], written["intermediate_size"]) == (2, 128, 32)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"mamba_n_heads": 6, "mamba_n_groups": 1},
            "config.json mamba_n_heads=6 x mamba_d_head=13 is not mamba_expand=2 x hidden_size=40",
        ),
        ({"mamba_n_groups": 3}, "config.json mamba_n_heads=10 is not a multiple of mamba_n_groups=3"),
        (
            {"time_step_limit": [0.0, 1.0]},
            "config.json time_step_limit=[0.0, 1.0] is not supported (gptzoo's Mamba-2 does not clamp its time step: "
            "[0.0, inf])",
        ),
        (
            {"mamba_proj_bias": True},
            "config.json mamba_proj_bias=True is not supported (gptzoo's Granite has no biases)",
        ),
        (
            {"position_embedding_type": "alibi"},
            "config.json position_embedding_type='alibi' is not 'rope', 'nope' or null",
        ),
    ],
    ids=["heads-do-not-fill-the-width", "groups-do-not-divide", "time-step-clamp", "projection-bias", "alibi"],
)
def test_granite_hybrid_config_fields_gptzoo_lacks_are_refused_by_name(
    tmp_path: Path, config: dict, problem: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "granitemoehybrid", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ["model.mlp={name='moe', experts=4, top_k=2, expert_ff=32, scoring='topk_softmax', normalize=false}"],
            "mlp 'moe' sets shared_ff=0, which GraniteMoeHybridForCausalLM has no field for",
        ),
        (
            ["model.layer_types.mamba.attention.heads=3", "model.layer_types.mamba.attention.value_dim=16"],
            "attention 'mamba2' sets mamba_inner=48, which GraniteMoeHybridForCausalLM has no field for",
        ),
        (["model.norm_placement=sandwich"], "norm_placement 'sandwich' (Granite is Pre-LN)"),
    ],
    ids=["no-shared-mlp", "inner-width-not-a-multiple", "sandwich"],
)
def test_recipes_granite_hybrid_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    assert (
        refusal("granite-4.0-h-tiny", overrides, "granitemoehybrid")
        == f"recipe 'granite-4.0-h-tiny' has no Hugging Face Granite 4.0-H equivalent: {reasons}"
    )


def test_a_family_without_multipliers_refuses_them_by_name() -> None:
    assert refusal("llama-tiny", ["model.residual_multiplier=0.5"], "llama") == (
        "recipe 'llama-tiny' has no Hugging Face Llama equivalent: residual_multiplier=0.5 (Llama does not scale by it)"
    )

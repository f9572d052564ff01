"""Kimi Linear against transformers on tiny random checkpoints (tests/hfparity.py): Kimi delta attention layers
between latent-attention layers without positions (latent norms at 1e-6 beside model norms at 1e-5), dense and
expert layers in any order, with and without a query bottleneck, at odd shapes and schedules that start and end
on either layer type; the released config.json's field names and linear_attn_config; config fields gptzoo lacks
and recipes it cannot express, refused by name."""

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
    "intermediate_size": 56,
    "moe_intermediate_size": 12,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 5,
    "kv_lora_rank": 8,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 6,
    "v_head_dim": 7,
    "num_local_experts": 6,
    "num_experts_per_tok": 2,
    "linear_num_heads": 3,
    "linear_head_dim": 5,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""Odd shapes: 5 latent-attention heads with keys of 6 + 4 and values of 7 from a latent of 8; 3 KDA heads of 5;
6 experts of 12, top 2, a shared one."""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {
                "layer_types": [
                    "full_attention",
                    "linear_attention",
                    "linear_attention",
                    "full_attention",
                    "linear_attention",
                ],
                "mlp_layer_types": ["dense", "sparse", "dense", "sparse", "sparse"],
                "linear_conv_kernel_dim": 3,
            },
            ["full_dense", "linear_moe", "linear_dense", "full_moe", "linear_moe"],
        ),
        (
            {
                "layer_types": [
                    "linear_attention",
                    "linear_attention",
                    "full_attention",
                    "linear_attention",
                    "full_attention",
                ],
                "q_lora_rank": 9,
                "num_expert_group": 2,
                "topk_group": 1,
                "rms_norm_eps": 1e-6,
            },
            ["linear_dense", "linear_moe", "full_moe", "linear_moe", "full_moe"],
        ),
    ],
    ids=["attention-first-dense-between", "kda-first-query-bottleneck-groups"],
)
def test_kimi_linear_matches_transformers(tmp_path: Path, extra: dict, expected: list[str]) -> None:
    config = transformers.KimiLinearConfig(**{**TINY, **extra})
    path = save_hf(tmp_path, "kimi_linear", config)
    derived = check_family(path, length=21)
    assert derived.model.schedule() == expected
    assert derived.model.position.name == "none"
    latent_eps = dict(derived.model.attention.params).get("latent_eps")
    assert latent_eps == (None if extra.get("rms_norm_eps") == 1e-6 else 1e-6)


def test_the_released_field_names_and_linear_attn_config_are_read(tmp_path: Path) -> None:
    """The released config.json names the experts' fields otherwise and gives the layers in linear_attn_config,
    1-indexed; the same model as the canonical names."""
    released = {k: v for k, v in TINY.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    released |= {"model_type": "kimi_linear", "num_experts": 6, "num_experts_per_token": 2, "num_shared_experts": 1}
    released |= {"moe_renormalize": True, "num_expert_group": 1, "first_k_dense_replace": 1}
    released["linear_attn_config"] = {
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4],
        "head_dim": 5,
        "num_heads": 3,
        "short_conv_kernel_size": 4,
    }
    (tmp_path / "config.json").write_text(json.dumps(released))
    model = hf_recipe(tmp_path).model
    assert model.schedule() == ["linear_dense", "linear_moe", "linear_moe", "full_moe", "linear_moe"]
    assert dict(model.layer_components("linear_moe")["attention"].params)["heads"] == 3
    assert dict(model.mlp.params)["experts"] == 6


def test_the_tiny_recipe_round_trips_through_its_export(tmp_path: Path) -> None:
    recipe = gptzoo.load_recipe("kimi-linear-tiny")
    export_hf(gptzoo.build_model(recipe), tmp_path)
    assert hf_recipe(tmp_path).model == recipe.model


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"num_key_value_heads": 1},
            "config.json num_key_value_heads=1 is not supported: Kimi Linear's latent attention expands its latent "
            "into keys and values for every one of the num_attention_heads=5 heads",
        ),
        (
            {"mlp_layer_types": ["dense", "sparse"]},
            "config.json mlp_layer_types=['dense', 'sparse'] is not a list of 5 'dense' or 'sparse'",
        ),
        (
            {"linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4]}},
            "config.json linear_attn_config kda_layers=[1, 2] and full_attn_layers=[4] do not name each of layers 1 "
            "to 5 once",
        ),
    ],
    ids=["grouped-kv", "mlp-types-length", "layers-left-out"],
)
def test_kimi_linear_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "kimi_linear", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ["model.attention.latent_eps=1e-5"],
            "attention 'mla' sets latent_norm_eps=1e-05, which KimiLinearForCausalLM has no field for",
        ),
        (
            ["model.position={name='rope', theta=1e4}"],
            "position 'rope' sets rope_theta=10000.0, which KimiLinearForCausalLM has no field for",
        ),
        (
            ["model.layer_types.linear_moe.attention={name='gated_deltanet'}"],
            "attention 'gated_deltanet' (it has no 'kimi_linear' layout: KimiLinearForCausalLM has no equivalent of "
            "it)",
        ),
    ],
    ids=["latent-eps", "rope", "another-mixer"],
)
def test_recipes_kimi_linear_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    assert (
        refusal("kimi-linear-tiny", overrides, "kimi_linear")
        == f"recipe 'kimi-linear-tiny' has no Hugging Face Kimi Linear equivalent: {reasons}"
    )

"""Qwen3-Next against transformers on tiny random checkpoints (tests/hfparity.py): gated DeltaNet layers whose
projections are stored grouped by key head, gated attention, experts with a gated shared expert, at odd shapes
and schedules that start and end on either layer type, with and without layers lacking experts; the shipped
recipe equal to the official config, total and active parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hfparity import check_family, check_shipped_recipe, config_problem, prompt, refusal, save_hf

import gptzoo
from gptzoo.hf import export_hf, load_hf
from gptzoo_plugins._gated_deltanet import GatedDeltaNet

TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "intermediate_size": 56,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "linear_num_value_heads": 6,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 10,
    "linear_value_head_dim": 14,
    "num_experts": 5,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 20,
    "max_position_embeddings": 128,
    "partial_rotary_factor": 0.5,
}
"""Odd shapes: 5 query heads of 12 sharing 1 key/value head; 2 key heads of 10 each serving 3 value heads of 14
(so in_proj_qkvz and in_proj_ba interleave two groups); 5 experts of 24, top 2, a shared expert of 20."""


@pytest.mark.parametrize(
    ("schedule", "kernel", "dense", "expected"),
    [
        (
            ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
            3,
            [],
            ["linear", "full", "linear", "linear", "full"],
        ),
        (
            ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
            4,
            [1],
            ["full_moe", "linear_dense", "linear_moe", "full_moe", "linear_moe"],
        ),
    ],
    ids=["deltanet-first", "attention-first-with-a-dense-layer"],
)
def test_qwen3_next_matches_transformers(
    tmp_path: Path, schedule: list[str], kernel: int, dense: list[int], expected: list[str]
) -> None:
    config = transformers.Qwen3NextConfig(
        **TINY, layer_types=schedule, linear_conv_kernel_dim=kernel, mlp_only_layers=dense
    )
    path = save_hf(tmp_path, "qwen3_next", config)
    derived = check_family(path, length=21)
    assert derived.model.schedule() == expected
    ids = prompt(96, 21)
    ours = load_hf(path).eval()
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(ids).logits
        for chunk in (5, 8):  # chunks that do not divide the prompt
            for block in ours.blocks:
                if isinstance(block.attn, GatedDeltaNet):
                    block.attn.chunk = chunk
            assert (ours(ids) - want).abs().max().item() <= 1e-4
    exported = json.loads((tmp_path / "qwen3_next-export" / "config.json").read_text())
    assert (exported["model_type"], exported["layer_types"], exported["mlp_only_layers"]) == (
        "qwen3_next",
        schedule,
        dense,
    )


def test_the_grouped_projections_hold_each_key_head_s_rows_together(tmp_path: Path) -> None:
    """in_proj_qkvz's first rows are key head 0's query, then its key, then its 3 value heads' values and z; in
    gptzoo's in_proj those are rows 0-9, 20-29, 40-81 and 124-165."""
    config = transformers.Qwen3NextConfig(**TINY, layer_types=["linear_attention"] * 5)
    path = save_hf(tmp_path, "qwen3_next", config)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ours = load_hf(path)
    qkvz, ba = theirs.model.layers[0].linear_attn.in_proj_qkvz.weight, theirs.model.layers[0].linear_attn.in_proj_ba
    mine = ours.blocks[0].attn
    group = torch.cat([mine.in_proj.weight[a:b] for a, b in ((0, 10), (20, 30), (40, 82), (124, 166))])
    assert torch.equal(qkvz[:104], group)
    assert torch.equal(ba.weight[:6], torch.cat([mine.gate_proj.weight[0:3], mine.gate_proj.weight[6:9]]))


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"linear_num_key_heads": 4},
            "config.json linear_num_value_heads=6 is not a multiple of linear_num_key_heads=4 (each key head serves "
            "as many value heads)",
        ),
        (
            {"num_experts_per_tok": 6},
            "config.json num_experts_per_tok=6 is more than the 5 experts of num_experts; it must be between 1 and 5",
        ),
        (
            {"mlp_only_layers": [7]},
            "config.json mlp_only_layers=[7] is not a list of layer indices between 0 and 4",
        ),
        ({"linear_conv_kernel_dim": 0}, "config.json linear_conv_kernel_dim=0 is not a positive integer"),
    ],
    ids=["heads-do-not-divide", "top-k-above-experts", "dense-layer-out-of-range", "no-taps"],
)
def test_qwen3_next_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "qwen3_next", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ["model.mlp={name='moe', experts=4, top_k=2, expert_ff=32, normalize=true}"],
            "mlp 'moe' sets shared_gate=False, which Qwen3NextForCausalLM has no field for",
        ),
        (
            ["model.attention={name='causal', qk_norm='head'}"],
            "layer 3's attention has qk_norm 'head' and output_gate=False (Qwen3-Next normalizes each head's q and k "
            "and gates its output)",
        ),
    ],
    ids=["no-shared-expert", "no-gate"],
)
def test_recipes_qwen3_next_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    assert (
        refusal("qwen3-next-tiny", overrides, "qwen3_next")
        == f"recipe 'qwen3-next-tiny' has no Hugging Face Qwen3-Next equivalent: {reasons}"
    )


def test_a_hybrid_with_experts_exports_as_qwen3_next_and_one_without_as_qwen3_5(tmp_path: Path) -> None:
    for name, model_type in (("qwen3-next-tiny", "qwen3_next"), ("qwen3.5-tiny", "qwen3_5_text")):
        export_hf(gptzoo.build_model(gptzoo.load_recipe(name)), tmp_path / name)
        assert json.loads((tmp_path / name / "config.json").read_text())["model_type"] == model_type


OFFICIAL = {  # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, as public copies quote it
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_shipped_recipe_is_the_official_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = check_shipped_recipe(tmp_path, "qwen3-next-80b-a3b", OFFICIAL, capsys)
    assert counts == (79_674_391_296, 3_874_929_408)

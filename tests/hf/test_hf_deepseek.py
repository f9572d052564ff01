"""DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention and their mixtures of experts): parity with
transformers on tiny random checkpoints at odd shapes (tests/hfparity.py: logits, greedy tokens, cached
decoding, export round trip), `compare`, the refusals, and the latent cache's size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json
from hfparity import check_family, check_shipped_recipe, prompt, save_hf

import gptzoo
from gptzoo.hf import NoEquivalentError, export_hf, hf_recipe, load_hf
from gptzoo.hf.compare import compare

TINY = {
    "vocab_size": 96,
    "hidden_size": 36,
    "intermediate_size": 40,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "max_position_embeddings": 64,
    "kv_lora_rank": 12,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "moe_intermediate_size": 16,
    "first_k_dense_replace": 1,
}
"""Tiny sizes: 3 heads (not a power of two), q/k heads of 8 + 4 features, v heads of 6, a latent of 12,
3 layers of which the first is dense."""
ROUTERS = ("gate.weight",)
"""The routers' weights, drawn wide: routing decided by margins, not ties."""


def parity(tmp_path: Path, name: str, config: transformers.PretrainedConfig) -> dict:
    path = save_hf(tmp_path, name, config, wide=ROUTERS)
    if config.model_type == "deepseek_v3":  # a correction bias that changes choices, not zeros
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path / "model.safetensors"))
        for key in [k for k in tensors if k.endswith("e_score_correction_bias")]:
            tensors[key] = torch.randn(tensors[key].shape, generator=torch.Generator().manual_seed(3)) * 0.5
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    recipe = check_family(path, length=20, kernels=("sdpa", "eager"))
    exported = json.loads((tmp_path / f"{name}-export" / "config.json").read_text())
    assert exported["model_type"] == config.model_type
    result = compare(path, prompts=[prompt(TINY["vocab_size"], 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result
    return {"recipe": recipe, "exported": exported}


@pytest.mark.parametrize(
    ("q_rank", "top_k", "groups"),
    [(None, 1, None), (20, 2, (3, 2))],
    ids=["q_proj-top1-greedy", "q_lora-top2-group_limited"],
)
def test_deepseek_v2_matches_transformers(tmp_path: Path, q_rank: int | None, top_k: int, groups: tuple | None) -> None:
    grouping = {"topk_method": "group_limited_greedy", "n_group": groups[0], "topk_group": groups[1]} if groups else {}
    config = transformers.DeepseekV2Config(
        **TINY,
        q_lora_rank=q_rank,
        n_routed_experts=6 if groups else 5,
        num_experts_per_tok=top_k,
        n_shared_experts=2,
        routed_scaling_factor=1.5,
        **grouping,
    )
    got = parity(tmp_path, "deepseek_v2", config)
    m = got["recipe"].model
    attention = {
        "kv_rank": 12,
        "nope_dim": 8,
        "v_dim": 6,
        "rope_interleave": True,
        **({"q_rank": 20} if q_rank else {}),
    }
    assert (m.attention.name, m.attention.kwargs, m.head_dim) == ("mla", attention, 4)
    assert m.layer_pattern == ("dense", "moe", "moe") and dict(m.layer_types)["dense"].mlp.name == "gated"
    assert m.mlp.kwargs == {
        "experts": 6 if groups else 5,
        "top_k": top_k,
        "expert_ff": 16,
        "normalize": False,
        "routed_scale": 1.5,
        "shared_ff": 32,
        **({"groups": 3, "group_top_k": 2} if groups else {}),
    }
    e = got["exported"]
    assert (e["first_k_dense_replace"], e["n_shared_experts"], e["q_lora_rank"]) == (1, 2, q_rank)
    assert e["topk_method"] == ("group_limited_greedy" if groups else "greedy")


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "rotate_half"])
def test_deepseek_v3_matches_transformers(tmp_path: Path, interleave: bool) -> None:
    config = transformers.DeepseekV3Config(
        **TINY,
        q_lora_rank=20,
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_group=3,
        topk_group=2,
        n_shared_experts=1,
        rope_interleave=interleave,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    got = parity(tmp_path, "deepseek_v3", config)
    m = got["recipe"].model
    assert m.attention.kwargs["rope_interleave"] is interleave
    assert m.mlp.kwargs == {
        "experts": 6,
        "top_k": 2,
        "expert_ff": 16,
        "scoring": "sigmoid",
        "score_bias": True,
        "normalize": True,
        "group_score": "top2",
        "routed_scale": 2.5,
        "shared_ff": 16,
        "groups": 3,
        "group_top_k": 2,
    }
    assert (got["exported"]["rope_interleave"], got["exported"]["n_group"]) == (interleave, 3)


def test_deepseek_v3_with_yarn_scales_the_softmax_by_mscale_squared(tmp_path: Path) -> None:
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    config = transformers.DeepseekV3Config(
        **TINY, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        rope_parameters=yarn,
    )  # fmt: skip
    got = parity(tmp_path, "deepseek_v3", config)
    mscale = 0.1 * math.log(4.0) + 1.0
    assert math.isclose(got["recipe"].model.attention.kwargs["scale"], 12**-0.5 * mscale**2, rel_tol=1e-12)
    assert got["exported"]["rope_parameters"]["mscale_all_dim"] == 1.0


def test_the_latent_cache_holds_the_latent_and_the_rotary_key_only(capsys: pytest.CaptureFixture[str]) -> None:
    built = run_json(capsys, "build", "deepseek-v2-lite")
    layer = 512 + 64  # kv_lora_rank + qk_rope_head_dim values per token
    held = built["memory"]["kv_cache_bytes_per_token"]["bfloat16"]
    assert held == 27 * layer * 2  # 27 layers, 2 bytes a value
    mha = 27 * 2 * 16 * (128 + 64) * 2  # what MHA would hold: keys of 128 + 64 and values of 128, wider still
    assert mha / held == pytest.approx(10.67, abs=0.01)


def test_a_scale_other_than_the_rope_scalings_is_refused_on_export(tmp_path: Path) -> None:
    config = transformers.DeepseekV3Config(**TINY, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
                                           n_group=1, topk_group=1)  # fmt: skip
    path = save_hf(tmp_path, "v3", config, wide=ROUTERS)
    model = load_hf(path)
    recipe = model.recipe.to_dict()
    recipe.pop("provenance", None)
    recipe["model"]["attention"] = {**recipe["model"]["attention"], "scale": 0.5}
    other = gptzoo.build_model(gptzoo.recipe.validate(recipe, "test", name="scaled"), device="meta")
    with pytest.raises(NoEquivalentError, match=r"attention 'mla' scales its scores by 1\.73205 x qk_head_dim\^-1/2"):
        export_hf(other, tmp_path / "out")


@pytest.mark.parametrize(
    ("feature", "field"),
    [("glu_limit", "glu_limit=7.0"), ("expert_bias", "expert_bias=True"), ("scoring", "scoring='topk_softmax'")],
)
def test_an_expert_feature_deepseek_has_no_field_for_is_refused_on_export(
    tmp_path: Path, feature: str, field: str
) -> None:
    config = transformers.DeepseekV2Config(**TINY, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2)
    model = load_hf(save_hf(tmp_path, "v2", config, wide=ROUTERS))
    recipe = model.recipe.to_dict()
    recipe.pop("provenance", None)
    value = {"glu_limit": 7.0, "expert_bias": True, "scoring": "topk_softmax"}[feature]
    recipe["model"]["mlp"] = {**recipe["model"]["mlp"], feature: value}
    other = gptzoo.build_model(gptzoo.recipe.validate(recipe, "test", name="featured"), device="meta")
    with pytest.raises(
        NoEquivalentError, match=f"mlp 'moe' sets {field}, which DeepseekV2ForCausalLM has no field for"
    ):
        export_hf(other, tmp_path / "out")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_key_value_heads", 1, r"num_key_value_heads=1 is not supported: DeepSeek-V3's latent attention"),
        ("rms_norm_eps", 1e-5, r"rms_norm_eps=1e-05 is not supported: DeepSeek-V3's latent norms use 1e-06"),
        ("num_experts_per_tok", 9, r"num_experts_per_tok=9 is more than the 4 experts of n_routed_experts"),
        ("kv_lora_rank", 64, r"kv_rank must be between 0 and the width n_embd \(36\)"),
        ("topk_group", 3, r"topk_group=3 is more than the n_group=2 groups"),
        ("attention_bias", True, r"attention_bias=true is not supported"),
    ],
)
def test_contradictory_configs_are_refused_naming_the_field(
    tmp_path: Path, field: str, value: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gptzoo.cli import main

    config = transformers.DeepseekV3Config(**TINY, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1)
    path = tmp_path / "bad"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**config.to_dict(), field: value}))
    with pytest.raises(Exception, match=message):
        hf_recipe(path)
    assert main(["build", "--hf", str(path)]) == 2
    assert re_search(message, capsys.readouterr().err)


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, " ".join(text.split())) is not None


# --- shipped recipes -------------------------------------------------------------------------------------------

OFFICIAL: dict[str, dict] = {
    "deepseek-v2-lite": {  # deepseek-ai/DeepSeek-V2-Lite
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "bos_token_id": 100000,
        "eos_token_id": 100001,
        "torch_dtype": "bfloat16",
    },
    "deepseek-v3": {  # deepseek-ai/DeepSeek-V3, but its fp8 quantization_config (the released weights', not the shape)
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "num_nextn_predict_layers": 1,
        "ep_size": 1,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    },
}
COUNTS = {
    "deepseek-v2-lite": (15_706_484_224, 2_661_150_208),
    "deepseek-v3": (671_026_404_352, 37_552_282_624),
}
"""(total, active per token) of each official config: transformers' count, less the experts a token skips."""


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_is_the_official_config_with_its_counts(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_shipped_recipe(tmp_path, name, OFFICIAL[name], capsys) == COUNTS[name]


def test_recipes_uses_mla_lists_the_latent_attention_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    listed = {row["name"] for row in run_json(capsys, "recipes", "--uses", "mla")}
    assert set(OFFICIAL) <= listed and "llama-tiny" not in listed
    assert set(OFFICIAL) <= {row["name"] for row in run_json(capsys, "recipes", "--uses", "moe")}

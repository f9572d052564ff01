"""The mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): parity with transformers on tiny
random checkpoints at odd shapes (tests/hfparity.py: both kernels, cached decoding, export round trip),
the layers without experts, the refusals, and the shipped recipes' parameter counts against the
official configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json
from hfparity import check_family, check_shipped_recipe, prompt, save_hf

import gptzoo
from gptzoo.hf import FAMILIES, NoEquivalentError, hf_recipe
from gptzoo.hf.compare import compare

TINY = {
    "vocab_size": 96,
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "intermediate_size": 40,
    "max_position_embeddings": 64,
}
"""Tiny sizes: 6 heads (not a power of two) of 8 features, 2 key/value heads, 3 layers."""
ROUTERS = ("gate.weight",)
"""The routers' weights (and Qwen2-MoE's shared expert gate), drawn wide: routing decided by margins, not ties."""


def parity(tmp_path: Path, name: str, config: transformers.PretrainedConfig, **checks: int) -> dict:
    path = save_hf(tmp_path, name, config, wide=ROUTERS)
    recipe = check_family(path, length=checks.pop("length", 20), **checks)
    exported = json.loads((tmp_path / f"{name}-export" / "config.json").read_text())
    assert exported["model_type"] == config.model_type
    result = compare(path, prompts=[prompt(TINY["vocab_size"], 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result
    return {"recipe": recipe, "exported": exported}


@pytest.mark.parametrize("top_k", [1, 2], ids=["top1", "top2"])
def test_mixtral_matches_transformers(tmp_path: Path, top_k: int) -> None:
    config = transformers.MixtralConfig(**TINY, num_local_experts=5, num_experts_per_tok=top_k)
    got = parity(tmp_path, "mixtral", config)
    m = got["recipe"].model
    assert (m.mlp.name, m.mlp.kwargs) == ("moe", {"experts": 5, "top_k": top_k})
    assert m.attention.name == "causal" and not m.layer_pattern
    assert {k: got["exported"][k] for k in ("num_local_experts", "num_experts_per_tok", "sliding_window")} == {
        "num_local_experts": 5,
        "num_experts_per_tok": top_k,
        "sliding_window": None,
    }


def test_mixtral_with_a_window_shorter_than_the_prompt(tmp_path: Path) -> None:
    config = transformers.MixtralConfig(**TINY, num_local_experts=3, num_experts_per_tok=2, sliding_window=6)
    got = parity(tmp_path, "mixtral", config, length=30, window=6)
    assert got["recipe"].model.attention.kwargs == {"window": 6}


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_qwen2_moe_matches_transformers_with_dense_layers(tmp_path: Path, normalize: bool) -> None:
    config = transformers.Qwen2MoeConfig(
        **TINY,
        num_experts=7,
        num_experts_per_tok=3,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=36,
        norm_topk_prob=normalize,
        mlp_only_layers=[0],
    )
    got = parity(tmp_path, "qwen2_moe", config)
    m = got["recipe"].model
    assert m.mlp.kwargs == {
        "experts": 7,
        "top_k": 3,
        "expert_ff": 24,
        "normalize": normalize,
        "shared_ff": 36,
        "shared_gate": True,
    }
    assert m.layer_pattern == ("dense", "moe", "moe") and dict(m.layer_types)["dense"].mlp.name == "gated"
    assert (got["exported"]["mlp_only_layers"], got["exported"]["decoder_sparse_step"]) == ([0], 1)


def test_qwen3_moe_matches_transformers_with_a_sparse_step(tmp_path: Path) -> None:
    config = transformers.Qwen3MoeConfig(
        **TINY,
        head_dim=8,
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=20,
        norm_topk_prob=True,
        decoder_sparse_step=2,
    )
    got = parity(tmp_path, "qwen3_moe", config)
    m = got["recipe"].model
    assert m.layer_pattern == ("dense", "moe") and m.attention.kwargs == {"qk_norm": "head"}
    assert got["exported"]["mlp_only_layers"] == [0, 2]


@pytest.mark.parametrize("top_k", [1, 3], ids=["top1", "top3"])
def test_olmoe_matches_transformers(tmp_path: Path, top_k: int) -> None:
    config = transformers.OlmoeConfig(**TINY, num_experts=5, num_experts_per_tok=top_k, pad_token_id=0)
    got = parity(tmp_path, "olmoe", config)
    m = got["recipe"].model
    assert m.attention.kwargs == {"qk_norm": "full"} and m.mlp.kwargs == {
        "experts": 5,
        "top_k": top_k,
        "normalize": False,
    }


def test_top_k_above_the_experts_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.mkdir()
    config = transformers.MixtralConfig(**TINY, num_local_experts=3, num_experts_per_tok=2).to_dict()
    (path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 4}))
    with pytest.raises(Exception, match=r"num_experts_per_tok=4 is more than the 3 experts of num_local_experts"):
        hf_recipe(path)


# --- shipped recipes -------------------------------------------------------------------------------------------

OFFICIAL: dict[str, dict] = {
    "mixtral-8x7b": {  # mistralai/Mixtral-8x7B-v0.1
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.02,
        "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 48,
        "tie_word_embeddings": False,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.001,
        "torch_dtype": "bfloat16",
    },
    "olmoe-1b-7b": {  # allenai/OLMoE-1B-7B-0924
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "vocab_size": 50304,
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "clip_qkv": None,
        "tie_word_embeddings": False,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.01,
        "pad_token_id": 1,
        "eos_token_id": 50279,
        "torch_dtype": "bfloat16",
    },
}


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_is_the_official_config_with_its_counts(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_shipped_recipe(tmp_path, name, OFFICIAL[name], capsys) == COUNTS[name]


COUNTS = {
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "olmoe-1b-7b": (6_919_161_856, 1_282_017_280),
}
"""(total, active per token) of each official config: transformers' count, less the skipped experts."""


def test_recipes_uses_moe_lists_the_sparse_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    listed = {row["name"] for row in run_json(capsys, "recipes", "--uses", "moe")}
    assert set(OFFICIAL) | {"moe-tiny"} <= listed
    assert "llama-tiny" not in listed


def test_a_missing_expert_tensor_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    from gptzoo.cli import main

    config = transformers.MixtralConfig(**TINY, num_local_experts=3, num_experts_per_tok=2)
    path = save_hf(tmp_path, "mixtral", config, wide=ROUTERS)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert main(["compare", "--hf", str(path)]) == 2
    missing = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    assert capsys.readouterr().err.endswith(f"does not fit MixtralForCausalLM 'mixtral': missing tensor {missing}\n")


DENSE_FIRST = ['model.layer_pattern=["dense", "moe"]', 'model.layer_types={dense={mlp="gated"}, moe={}}']
"""moe-tiny with a layer without experts first."""


def export_fields(family: str, overrides: list[str]) -> dict:
    from gptzoo.model.build import assemble

    recipe = gptzoo.load_recipe("moe-tiny", overrides)
    components: list = []
    skeleton = assemble(recipe, gptzoo.get_registry(), torch.device("meta"), components)
    return FAMILIES[family].config(recipe, skeleton, components)


def test_a_dense_layer_has_no_place_in_mixtral_or_olmoe() -> None:
    with pytest.raises(NoEquivalentError) as excinfo:
        export_fields("mixtral", [*DENSE_FIRST, 'model.attention={name="causal", qk_norm="full"}'])
    assert excinfo.value.reasons == [
        "attention 'causal' sets qk_norm='full', which MixtralForCausalLM has no field for",
        "mlp 'moe' sets own_width=True, which MixtralForCausalLM has no field for",
        "mlp 'gated' does not set norm_topk_prob=True, which MixtralForCausalLM implies",
    ]
    olmoe = [*DENSE_FIRST, 'model.attention={name="causal", qk_norm="full"}', "model.d_ff=96"]
    with pytest.raises(NoEquivalentError) as excinfo:
        export_fields("olmoe", olmoe)
    assert excinfo.value.reasons == ["no experts on layer 0 (OLMoE has experts in every layer)"]
    qwen3 = [*DENSE_FIRST, 'model.attention={name="causal", qk_norm="head"}', "model.head_dim=16"]
    fields = export_fields("qwen3_moe", qwen3)
    assert (fields["mlp_only_layers"], fields["num_experts"], fields["moe_intermediate_size"]) == ([0], 4, 96)

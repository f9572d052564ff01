"""Gemma 2 and Gemma 3 (text) against transformers: random-init checkpoints from tiny configs (every
check of tests/hfparity.py, on prompts longer than the sliding window), the shipped recipes against
the official configs, and what a Gemma family refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hfparity import check_family, save_hf

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import NoEquivalentError, export_hf, hf_recipe, load_hf

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
}
GEMMA3_270M = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "use_bidirectional_attention": False,
    "vocab_size": 262144,
}
"""google/gemma-3-270m's config.json (transformers 4.55 keys), the fields that decide the model."""
GEMMA2_2B = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
"""google/gemma-2-2b's config.json, the fields that decide the model."""


def gemma3(**kw: Any) -> transformers.Gemma3TextConfig:
    return transformers.Gemma3TextConfig(
        **{**TINY, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 6, "sliding_window": 8, **kw}
    )


def gemma2(**kw: Any) -> transformers.Gemma2Config:
    return transformers.Gemma2Config(
        **{**TINY, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "sliding_window": 8, **kw}
    )


def test_gemma3_matches_transformers_across_the_window(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "g3", gemma3(query_pre_attn_scalar=24))
    recipe = check_family(path, length=40, window=8)
    m = recipe.model
    assert m.schedule() == ["sliding"] * 5 + ["full"] and m.norm_placement == "sandwich" and m.scale_embeddings
    sliding = m.layer_components("sliding")
    assert sliding["attention"].name == "sliding_window" and sliding["attention"].kwargs["window"] == 8
    assert sliding["position"].kwargs == {"theta": 10000.0} and m.position.kwargs == {"theta": 1000000.0}
    assert m.attention.kwargs == {"qk_norm": "head", "scale": 24**-0.5}


def test_gemma3_linear_rope_scaling_on_full_layers_and_a_short_pattern(tmp_path: Path) -> None:
    """The 4B and larger scale the full layers' RoPE only; here the pattern does not divide n_layer."""
    config = gemma3(
        num_hidden_layers=5,
        sliding_window_pattern=3,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    path = save_hf(tmp_path, "g3", config)
    written = json.loads((path / "config.json").read_text())
    del written["layer_types"]  # as older files: derived from the pattern, sliding, sliding, full, sliding, sliding
    (path / "config.json").write_text(json.dumps({**written, "sliding_window_pattern": 3}))
    recipe = check_family(path, length=40, window=8)
    assert recipe.model.schedule() == ["sliding", "sliding", "full", "sliding", "sliding"]
    assert recipe.model.position.name == "rope_linear" and recipe.model.position.kwargs["factor"] == 8.0


def test_gemma2_matches_transformers_with_soft_capping(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "g2", gemma2(query_pre_attn_scalar=16, attn_logit_softcapping=5.0))
    recipe = check_family(path, length=40, window=8)
    m = recipe.model
    assert m.schedule() == ["sliding", "full"] * 2 and m.logit_softcap == 30.0
    assert m.attention.kwargs == {"scale": 0.25, "softcap": 5.0}


def test_gemma2_without_soft_capping_exports_null_caps(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "g2", gemma2(attn_logit_softcapping=None, final_logit_softcapping=None))
    recipe = check_family(path, length=40, window=8)
    assert recipe.model.logit_softcap == 0.0 and "softcap" not in recipe.model.attention.kwargs
    exported = json.loads((tmp_path / "g2-export" / "config.json").read_text())
    assert exported["attn_logit_softcapping"] is None and exported["final_logit_softcapping"] is None


@pytest.mark.parametrize(
    ("name", "config", "family"),
    [("gemma3-270m", GEMMA3_270M, "Gemma3ForCausalLM"), ("gemma2-2b", GEMMA2_2B, "Gemma2ForCausalLM")],
)
def test_shipped_recipes_are_the_official_configs(tmp_path: Path, name: str, config: dict, family: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    derived, shipped = hf_recipe(tmp_path), gptzoo.load_recipe(name)
    load = gptzoo.build_model(shipped, device="meta")
    assert gptzoo.build(name)["params"]["total"] == sum(p.numel() for p in load.parameters())
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert type(theirs).__name__ == family
    assert sum(p.numel() for p in load.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert shipped.model.schedule() == derived.model.schedule()
    for layer_type in dict.fromkeys(shipped.model.schedule()):
        ours, official = shipped.model.layer_components(layer_type), derived.model.layer_components(layer_type)
        assert {k: (c.name, c.kwargs) for k, c in ours.items()} == {k: (c.name, c.kwargs) for k, c in official.items()}
    sizes = ("vocab_size", "context_length", "n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "d_ff", "bias")
    flags = ("tie_embeddings", "scale_embeddings", "logit_softcap", "norm_placement")
    assert all(getattr(shipped.model, k) == getattr(derived.model, k) for k in (*sizes, *flags))


def test_gemma3_270m_shows_its_schedule_kv_bytes_and_windowed_flops() -> None:
    summary = gptzoo.build("gemma3-270m", seq_len=4096)
    assert summary["params"]["total"] == 268_098_176
    assert summary["schedule"]["text"] == "(sliding x5, full) x3"
    assert summary["schedule"]["count"] == {"sliding": 15, "full": 3}
    by_type = summary["memory"]["kv_cache_bytes_per_token_by_layer_type"]
    # a full layer keeps every key: k and v, 1 head of 256 floats each, per token
    assert by_type["full"] == {"layers": 3, "float32": 3 * 2 * 256 * 4, "bfloat16": 3 * 2 * 256 * 2}
    # a sliding layer keeps 512 keys, spread over the 4096 tokens
    assert by_type["sliding"]["float32"] == 15 * 2 * 256 * 4 * 512 // 4096
    scores = summary["flops"]["by_component"]["attention scores"]
    full_layer = 4 * 4 * 256 * 4096 * 4096  # 2 matmuls x 2 FLOPs x heads x head_dim x T^2
    blocks = [(2048, 2048), (2048, 2048 + 511)]  # queries x keys of the two 4 x window blocks
    sliding_layer = 4 * 4 * 256 * sum(q * k for q, k in blocks)
    assert scores == 3 * full_layer + 15 * sliding_layer


def test_what_the_gemma_families_refuse(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "g3", gemma3())
    config = json.loads((path / "config.json").read_text())
    for change, problem in [
        ({"use_bidirectional_attention": True}, "config.json use_bidirectional_attention=True is not supported"),
        (
            {"sliding_window": None},
            "config.json sliding_window=None, but layer_types has sliding_attention layers; give the window",
        ),
        (  # transformers reads a flat table as the full layers' defaults, whatever its theta says
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
            "config.json rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0} is one table; Gemma 3 has "
            "one per layer type",
        ),
    ]:
        (path / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(RecipeError) as info:
            hf_recipe(path)
        assert info.value.problems[0].startswith(problem), info.value.problems
    (path / "config.json").write_text(json.dumps(config))
    plain_norm = load_hf(save_hf(tmp_path, "g2", gemma2()))
    plain_norm.recipe = gptzoo.load_recipe(
        "gemma2-2b", ["model.n_layer=2", "model.n_embd=64", "model.head_dim=16", "model.norm=rmsnorm"]
    )
    with pytest.raises(NoEquivalentError) as excinfo:
        export_hf(gptzoo.build_model(plain_norm.recipe, device="meta"), tmp_path / "out")
    assert "Gemma2ForCausalLM implies rms_norm_offset=1.0, which no component gives" in str(excinfo.value)
    assert not (tmp_path / "out").exists()

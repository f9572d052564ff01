"""The hybrid families, a recurrent or convolutional token mixer between attention layers, against transformers
on tiny random checkpoints (tests/hfparity.py: both kernels, 32 greedy tokens, cached decoding, export then
import), at odd shapes and schedules that start and end on either layer type; their config fields gptzoo lacks
refused by name; the shipped recipes equal to the official configs, parameter for parameter. LFM2: gated short
convolutions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json
from hfparity import check_family, prompt, save_hf

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import FAMILIES, NoEquivalentError, check_recipe_matches, hf_recipe
from gptzoo.hf.compare import compare
from gptzoo.model.build import assemble

LFM2_TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "intermediate_size": 90,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "block_multiple_of": 8,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize(
    ("schedule", "kernel"),
    [
        (["conv", "full_attention", "conv", "conv", "full_attention"], 4),  # starts on a convolution
        (["full_attention", "conv", "conv", "full_attention", "conv"], 3),  # starts on attention, ends on a convolution
    ],
    ids=["conv-first", "attention-first"],
)
def test_lfm2_matches_transformers(tmp_path: Path, schedule: list[str], kernel: int) -> None:
    config = transformers.Lfm2Config(**LFM2_TINY, layer_types=schedule, conv_L_cache=kernel)
    path = save_hf(tmp_path, "lfm2", config)
    derived = check_family(path, length=21)
    assert derived.model.schedule() == ["conv" if t == "conv" else "full" for t in schedule]
    assert derived.model.d_ff == 64  # int(2/3 x 90) = 60, rounded up to a multiple of 8
    result = compare(path, prompts=[prompt(96, 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result


def test_lfm2_reads_full_attn_idxs_and_the_older_field_names(tmp_path: Path) -> None:
    """Older LFM2 files name the attention layers by index, the MLP's width block_ff_dim and the tie
    tie_embedding; an unadjusted width is the width."""
    config = {
        **LFM2_TINY,
        "model_type": "lfm2",
        "full_attn_idxs": [1, 4],
        "block_ff_dim": 60,
        "block_auto_adjust_ff_dim": False,
        "tie_embedding": False,
    }
    del config["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = hf_recipe(tmp_path).model
    assert model.schedule() == ["conv", "full", "conv", "conv", "full"]
    assert (model.d_ff, model.tie_embeddings) == (60, False)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"conv_bias": True}, "config.json conv_bias=true is not supported (gptzoo's LFM2 has no biases)"),
        (
            {"layer_types": ["conv", "full_attention"]},
            "config.json layer_types=['conv', 'full_attention'] is not a list of 5 'conv' or 'full_attention' entries",
        ),
        (
            {"layer_types": None, "full_attn_idxs": [1, 7]},
            "config.json full_attn_idxs=[1, 7] is not a list of layer indices below 5",
        ),
        ({"conv_L_cache": 0}, "config.json conv_L_cache=0 is not a positive integer"),
        (
            {"use_pos_enc": False},
            "config.json use_pos_enc=False is not supported (gptzoo implements use_pos_enc=True only)",
        ),
    ],
    ids=["conv-bias", "schedule-length", "attention-index", "no-taps", "no-positions"],
)
def test_lfm2_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    base = {**LFM2_TINY, "model_type": "lfm2", "layer_types": ["conv", "full_attention", "conv", "conv", "conv"]}
    (tmp_path / "config.json").write_text(json.dumps({**base, **config}))
    with pytest.raises(RecipeError) as excinfo:
        hf_recipe(tmp_path)
    assert str(excinfo.value) == f"{tmp_path / 'config.json'}: {problem}"


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ['model.attention="causal"'],
            "layer 2's attention has qk_norm 'none' (LFM2 normalizes each head's q and k)",
        ),
        (
            ["model.layer_types.conv.attention={name='gated_deltanet'}"],
            "attention 'gated_deltanet' (it has no 'lfm2' layout: Lfm2ForCausalLM has no equivalent of it)",
        ),
        (["model.bias=true"], "bias=true (LFM2 has no biases)"),
    ],
    ids=["no-qk-norm", "another-mixer", "bias"],
)
def test_recipes_lfm2_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    loaded = gptzoo.load_recipe("lfm2-tiny", overrides)
    components: list = []
    skeleton = assemble(loaded, gptzoo.get_registry(), torch.device("meta"), components)
    with pytest.raises(NoEquivalentError) as excinfo:
        FAMILIES["lfm2"].config(loaded, skeleton, components)
    assert str(excinfo.value) == f"recipe 'lfm2-tiny' has no Hugging Face LFM2 equivalent: {reasons}"


OFFICIAL = {
    "lfm2-350m": {  # LiquidAI/LFM2-350M's config.json, as public copies quote it
        "architectures": ["Lfm2ForCausalLM"],
        "block_auto_adjust_ff_dim": True,
        "block_dim": 1024,
        "block_ff_dim": 6656,
        "block_ffn_dim_multiplier": 1.0,
        "block_mlp_init_scale": 1.0,
        "block_multiple_of": 256,
        "block_norm_eps": 1e-05,
        "block_out_init_scale": 1.0,
        "block_use_swiglu": True,
        "block_use_xavier_init": True,
        "bos_token_id": 1,
        "conv_L_cache": 3,
        "conv_bias": False,
        "conv_dim": 1024,
        "conv_dim_out": 1024,
        "conv_use_xavier_init": True,
        "eos_token_id": 7,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "max_position_embeddings": 128000,
        "model_type": "lfm2",
        "norm_eps": 1e-05,
        "num_attention_heads": 16,
        "num_heads": 16,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rope_theta": 1000000.0,
        "tie_embedding": True,
        "use_cache": True,
        "use_pos_enc": True,
        "vocab_size": 65536,
    },
}


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_is_the_official_config(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped recipe is what the official config.json derives, and gptzoo build counts transformers'
    parameters of it (its class built on the meta device)."""
    (tmp_path / "config.json").write_text(json.dumps(OFFICIAL[name]))
    shipped, derived = gptzoo.load_recipe(name), hf_recipe(tmp_path)
    assert shipped.model == derived.model
    check_recipe_matches(shipped, derived, gptzoo.get_registry())
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**OFFICIAL[name]))
    assert run_json(capsys, "build", name)["params"]["total"] == sum(p.numel() for p in theirs.parameters())


def test_lfm2_350m_state_is_a_fixed_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """10 convolutions of 1024 channels keep their last 2 inputs: 20,480 numbers a sequence, at any length."""
    memory = run_json(capsys, "build", "lfm2-350m")["memory"]
    assert memory["state_bytes_per_sequence"] == {"float32": 10 * 1024 * 2 * 4, "bfloat16": 10 * 1024 * 2 * 2}
    assert memory["kv_cache_bytes_per_token"] == {"float32": 6 * 2 * 8 * 64 * 4, "bfloat16": 6 * 2 * 8 * 64 * 2}


def test_the_tiny_lfm2_learns() -> None:
    model = gptzoo.build_model(gptzoo.load_recipe("lfm2-tiny"))
    ids = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses

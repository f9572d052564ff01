"""The hybrid families, a recurrent or convolutional token mixer between attention layers, against transformers
on tiny random checkpoints (tests/hfparity.py: both kernels, 32 greedy tokens, cached decoding, export then
import), at odd shapes and schedules that start and end on either layer type; their config fields gptzoo lacks
refused by name; the shipped recipes equal to the official configs, parameter for parameter. LFM2: gated short
convolutions; Qwen3.5: gated DeltaNet beside gated attention, also saved as its vision-language class; SmolLM3:
layers without positions (NoPE) between RoPE layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_error, run_json
from hfparity import check_family, config_problem, prompt, refusal, save_hf
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import check_recipe_matches, export_hf, hf_recipe, load_hf
from gptzoo.hf.compare import compare
from gptzoo_plugins._gated_deltanet import GatedDeltaNet

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
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


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
    assert (
        refusal("lfm2-tiny", overrides, "lfm2") == f"recipe 'lfm2-tiny' has no Hugging Face LFM2 equivalent: {reasons}"
    )


QWEN3_5_TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 5,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "linear_num_value_heads": 6,
    "linear_num_key_heads": 3,
    "linear_key_head_dim": 5,
    "linear_value_head_dim": 7,
    "max_position_embeddings": 128,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [1, 1, 1],
        "mrope_interleaved": True,
    },
}
"""Odd shapes: 3 query heads of 12 sharing 1 key/value head; 3 key heads of 5 serving 6 value heads of 7."""


@pytest.mark.parametrize(
    ("schedule", "kernel"),
    [
        (["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"], 3),
        (["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"], 4),
    ],
    ids=["deltanet-first", "attention-first"],
)
def test_qwen3_5_matches_transformers(tmp_path: Path, schedule: list[str], kernel: int) -> None:
    config = transformers.Qwen3_5TextConfig(**QWEN3_5_TINY, layer_types=schedule, linear_conv_kernel_dim=kernel)
    path = save_hf(tmp_path, "qwen3_5", config)
    derived = check_family(path, length=21)
    assert derived.model.schedule() == ["linear" if t == "linear_attention" else "full" for t in schedule]
    ids = prompt(96, 21)
    ours = load_hf(path).eval()
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(ids).logits
        for chunk in (5, 8):  # chunks that do not divide the prompt (how the layers compute, not what)
            for block in ours.blocks:
                if isinstance(block.attn, GatedDeltaNet):
                    block.attn.chunk = chunk
            assert (ours(ids) - want).abs().max().item() <= 1e-4
    result = compare(path, prompts=[prompt(96, 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result


def test_a_qwen3_5_vision_language_checkpoint_loads_its_text_model(tmp_path: Path) -> None:
    """Saved as Qwen3_5ForConditionalGeneration: the text model under model.language_model., the config under
    text_config, a vision tower beside it. gptzoo loads the text model (the logits of transformers' own, on
    text), leaves the tower, and exports it as Qwen3_5ForCausalLM."""
    vision = {
        "depth": 1,
        "hidden_size": 16,
        "num_heads": 2,
        "intermediate_size": 32,
        "out_hidden_size": 40,
        "patch_size": 2,
        "spatial_merge_size": 1,
        "temporal_patch_size": 1,
        "num_position_embeddings": 16,
    }
    text = {**QWEN3_5_TINY, "num_hidden_layers": 4}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    theirs = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    theirs.save_pretrained(tmp_path / "vl")
    ids = prompt(96, 17)
    ours = load_hf(tmp_path / "vl").eval()
    with torch.no_grad():
        assert (ours(ids) - theirs(input_ids=ids).logits).abs().max().item() <= 1e-4
    assert hf_recipe(tmp_path / "vl").model.schedule() == ["linear", "linear", "linear", "full"]
    export_hf(ours, tmp_path / "text")
    written = json.loads((tmp_path / "text" / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("qwen3_5_text", ["Qwen3_5ForCausalLM"])


def test_a_checkpoint_missing_a_layer_s_state_parameters_is_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = transformers.Qwen3_5TextConfig(
        **QWEN3_5_TINY, layer_types=["linear_attention", "full_attention"] * 2 + ["full_attention"]
    )
    path = save_hf(tmp_path, "qwen3_5", config)
    tensors = load_file(path / "model.safetensors")
    for name in ("A_log", "dt_bias"):
        del tensors[f"model.layers.2.linear_attn.{name}"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    message = run_error(capsys, "build", "--hf", str(path), "--out", str(out))
    assert "missing tensor model.layers.2.linear_attn.A_log" in message
    assert "missing tensor model.layers.2.linear_attn.dt_bias" in message
    assert not out.exists()


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"attn_output_gate": False},
            "config.json attn_output_gate=False is not supported (Qwen3.5's attention has attn_output_gate=True)",
        ),
        (
            {"linear_num_key_heads": 4},
            "config.json linear_num_value_heads=6 is not a multiple of linear_num_key_heads=4 (each key head serves "
            "as many value heads)",
        ),
        (
            {"layer_types": ["linear_attention"] * 3},
            "config.json layer_types=['linear_attention', 'linear_attention', 'linear_attention'] is not a list of 5 "
            "'linear_attention' or 'full_attention' entries",
        ),
        ({"linear_conv_kernel_dim": 0}, "config.json linear_conv_kernel_dim=0 is not a positive integer"),
        (
            {"mamba_ssm_dtype": "bfloat16"},
            "config.json mamba_ssm_dtype='bfloat16' is not supported (gptzoo implements mamba_ssm_dtype='float32' "
            "only)",
        ),
    ],
    ids=["no-gate", "heads-do-not-divide", "schedule-length", "no-taps", "state-dtype"],
)
def test_qwen3_5_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_5_TINY, "model_type": "qwen3_5_text", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


def test_a_vision_language_config_without_its_text_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    with pytest.raises(RecipeError, match=r"config.json text_config has no 'vocab_size'; "):
        hf_recipe(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "reasons"),
    [
        (
            ["model.attention={name='causal', qk_norm='head'}"],
            "layer 3's attention has qk_norm 'head' and output_gate=False (Qwen3.5 normalizes each head's q and k and "
            "gates its output)",
        ),
        (
            ["model.layer_types.linear.attention={name='gated_deltanet', neg_eigval=true}"],
            "attention 'gated_deltanet' sets linear_allow_neg_eigval=True, which Qwen3_5ForCausalLM has no field for",
        ),
        (
            ["model.layer_types.linear.attention={name='short_conv'}"],
            "attention 'short_conv' (it has no 'qwen3_5' layout: Qwen3_5ForCausalLM has no equivalent of it)",
        ),
    ],
    ids=["no-gate", "negative-eigenvalues", "another-mixer"],
)
def test_recipes_qwen3_5_cannot_express_are_refused(overrides: list[str], reasons: str) -> None:
    assert (
        refusal("qwen3.5-tiny", overrides, "qwen3_5_text")
        == f"recipe 'qwen3.5-tiny' has no Hugging Face Qwen3.5 equivalent: {reasons}"
    )


SMOLLM3_TINY = {
    "vocab_size": 96,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 5,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}


@pytest.mark.parametrize("uses", [[0, 1, 1, 0, 1], [1, 1, 1, 0, 0]], ids=["nope-first", "nope-last"])
def test_smollm3_matches_transformers(tmp_path: Path, uses: list[int]) -> None:
    path = save_hf(tmp_path, "smollm3", transformers.SmolLM3Config(**SMOLLM3_TINY, no_rope_layers=uses))
    derived = check_family(path, length=21)
    assert derived.model.schedule() == ["rope" if u else "nope" for u in uses]
    exported = json.loads((tmp_path / "smollm3-export" / "config.json").read_text())
    assert (exported["model_type"], exported["no_rope_layers"]) == ("smollm3", uses)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"use_sliding_window": True, "sliding_window": 8},
            "config.json use_sliding_window=true is not supported (gptzoo's SmolLM3 attends to every key)",
        ),
        ({"no_rope_layers": [1, 0]}, "config.json no_rope_layers=[1, 0] is not a list of 5 0s and 1s"),
        (
            {"no_rope_layers": [1, 2, 1, 0, 1]},
            "config.json no_rope_layers=[1, 2, 1, 0, 1] is not a list of 5 0s and 1s",
        ),
    ],
    ids=["sliding-window", "schedule-length", "not-a-flag"],
)
def test_smollm3_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM3_TINY, "model_type": "smollm3", **config}))
    assert config_problem(tmp_path) == f"{tmp_path / 'config.json'}: {problem}"


def test_a_recipe_with_rope_on_every_layer_exports_as_llama_and_one_with_nope_layers_as_smollm3(tmp_path: Path) -> None:
    for name, model_type in (("llama-tiny", "llama"), ("smollm3-tiny", "smollm3")):
        export_hf(gptzoo.build_model(gptzoo.load_recipe(name)), tmp_path / name)
        assert json.loads((tmp_path / name / "config.json").read_text())["model_type"] == model_type


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
    "qwen3.5-0.8b": {  # Qwen/Qwen3.5-0.8B's text_config: best-known values (public copies agree on every field)
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": 248320,
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "max_position_embeddings": 262144,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": True,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    "smollm3-3b": {  # HuggingFaceTB/SmolLM3-3B's config.json, as public copies quote it
        "architectures": ["SmolLM3ForCausalLM"],
        "model_type": "smollm3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128012,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 11008,
        "max_position_embeddings": 65536,
        "mlp_bias": False,
        "no_rope_layer_interval": 4,
        "no_rope_layers": [1, 1, 1, 0] * 9,
        "num_attention_heads": 16,
        "num_hidden_layers": 36,
        "num_key_value_heads": 4,
        "pad_token_id": 128004,
        "pretraining_tp": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 5000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": 128256,
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


@pytest.mark.parametrize(
    "name",
    [
        "lfm2-tiny",
        "qwen3.5-tiny",
        "qwen3-next-tiny",
        "olmo-hybrid-tiny",
        "granite-4.0-h-tiny",
        "kimi-linear-tiny",
        "smollm3-tiny",
    ],
)
def test_the_tiny_hybrids_learn(name: str) -> None:
    model = gptzoo.build_model(gptzoo.load_recipe(name))
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

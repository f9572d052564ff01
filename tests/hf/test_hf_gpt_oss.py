"""gpt-oss (GptOssForCausalLM): parity with transformers on tiny random checkpoints at odd shapes
(tests/hfparity.py: logits, greedy tokens, cached decoding across the window, export round trip, and
``gptzoo compare --hf``), its stacked expert tensors, the refusals, and the shipped recipe's parameter
counts against the official config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json
from hfparity import check_family, check_shipped_recipe, prompt, save_hf

import gptzoo
from gptzoo.cli import main
from gptzoo.hf import FAMILIES, NoEquivalentError, hf_recipe, load_hf
from gptzoo.hf.compare import compare
from gptzoo.hf.tensor_map import TensorMap, stack_slices

TINY = {
    "vocab_size": 96,
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 40,
    "max_position_embeddings": 64,
    "sliding_window": 6,
}
"""Tiny sizes: 6 heads (not a power of two) of 8 features, 2 key/value heads, 3 layers (sliding, full,
sliding: GptOssConfig's alternation), a window of 6 keys."""
WIDE = ("router.weight", "sinks", "gate_up_proj_bias", "down_proj_bias")
"""Drawn from normal(0, 1): the routers (routing by margins, not ties), the sinks (a sink logit that
matters), the experts' biases (transformers leaves them zero, which would hide a misplaced one)."""


def parity(tmp_path: Path, config: transformers.GptOssConfig, length: int = 30) -> dict:
    path = save_hf(tmp_path, "gpt_oss", config, wide=WIDE)
    recipe = check_family(path, length=length, window=config.sliding_window)
    exported = json.loads((tmp_path / "gpt_oss-export" / "config.json").read_text())
    assert exported["model_type"] == "gpt_oss"
    result = compare(path, prompts=[prompt(TINY["vocab_size"], 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result
    return {"recipe": recipe, "exported": exported, "path": path}


@pytest.mark.parametrize(("experts", "top_k"), [(5, 1), (7, 3)], ids=["top1", "top3"])
def test_gpt_oss_matches_transformers(tmp_path: Path, experts: int, top_k: int) -> None:
    config = transformers.GptOssConfig(**TINY, num_local_experts=experts, num_experts_per_tok=top_k)
    got = parity(tmp_path, config)
    m = got["recipe"].model
    assert (m.mlp.name, m.mlp.kwargs) == (
        "moe",
        {
            "experts": experts,
            "top_k": top_k,
            "scoring": "topk_softmax",
            "normalize": False,
            "router_bias": True,
            "expert_bias": True,
            "glu_limit": 7.0,
        },
    )
    assert m.bias and m.activation.name == "quick_gelu" and m.layer_pattern == ("sliding", "full")
    assert m.attention.kwargs == {"sinks": True}
    assert dict(m.layer_types)["sliding"].attention.kwargs == {"sinks": True, "window": 6}
    assert (m.position.name, dict(m.position.kwargs)["factor"]) == ("rope_yarn", 32.0)
    exported = got["exported"]
    assert exported["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert {k: exported[k] for k in ("num_local_experts", "num_experts_per_tok", "swiglu_limit", "swiglu_alpha")} == {
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "swiglu_limit": 7.0,
        "swiglu_alpha": 1.702,
    }
    assert exported["rope_parameters"]["rope_type"] == "yarn" and exported["rope_parameters"]["truncate"] is False
    sinks = load_hf(got["path"]).blocks[0].attn.sinks
    assert sinks is not None and sinks.abs().min().item() > 0.0


def test_gpt_oss_without_attention_biases_with_a_clamp_its_values_cross(tmp_path: Path) -> None:
    """attention_bias false (the experts keep theirs), swiglu_limit 0.5 (gate and up values cross it),
    plain RoPE, SiLU's alpha, and a layer_types of its own (full first, then two sliding layers)."""
    config = transformers.GptOssConfig(
        **TINY,
        num_local_experts=3,
        num_experts_per_tok=2,
        attention_bias=False,
        swiglu_limit=0.5,
        swiglu_alpha=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
    )
    got = parity(tmp_path, config)
    m = got["recipe"].model
    assert not m.bias and m.activation.name == "silu" and dict(m.mlp.kwargs)["glu_limit"] == 0.5
    assert m.layer_pattern == ("full", "sliding", "sliding") and m.position.name == "rope"
    assert got["exported"]["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000.0}
    assert (got["exported"]["attention_bias"], got["exported"]["swiglu_alpha"]) == (False, 1.0)


def test_the_experts_are_stored_stacked_with_gate_and_up_interleaved(tmp_path: Path) -> None:
    from safetensors import safe_open

    config = transformers.GptOssConfig(**TINY, num_local_experts=3, num_experts_per_tok=2)
    path = save_hf(tmp_path, "gpt_oss", config, wide=WIDE)
    model = load_hf(path)
    expert = model.blocks[1].mlp.experts[2]
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        gate_up = f.get_tensor("model.layers.1.mlp.experts.gate_up_proj")  # (E, d, 2 ff)
        down = f.get_tensor("model.layers.1.mlp.experts.down_proj")  # (E, ff, d)
    assert gate_up.shape == (3, 48, 80) and down.shape == (3, 40, 48)
    gate, up = expert.c_fc.weight.chunk(2)  # (ff, d) each
    assert torch.equal(gate_up[2, :, 0::2], gate.t()) and torch.equal(gate_up[2, :, 1::2], up.t())
    assert torch.equal(down[2], expert.c_proj.weight.t())


def test_a_stacked_tensor_needs_every_slice() -> None:
    maps = [TensorMap(f"e.{i}", ("stacked",), stack=3, index=i) for i in (0, 2)]
    with pytest.raises(ValueError, match=r"stacked: no map gives its slices \[1\]"):
        stack_slices([(m, "stacked", torch.ones(2)) for m in maps])
    with pytest.raises(ValueError, match="needs 0 <= index < stack=3"):
        TensorMap("e.3", ("stacked",), stack=3, index=3)


def write_config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "bad"
    path.mkdir()
    config = transformers.GptOssConfig(**TINY, num_local_experts=3, num_experts_per_tok=2).to_dict()
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"num_experts_per_tok": 4}, "num_experts_per_tok=4 is more than the 3 experts of num_local_experts"),
        (
            {"layer_types": ["sliding_attention", "full_attention"]},
            "layer_types=['sliding_attention', 'full_attention'] is not a list of num_hidden_layers=3",
        ),
        ({"swiglu_alpha": 2.0}, "swiglu_alpha=2.0 is not supported (gptzoo implements 1.702"),
        ({"swiglu_limit": 0.0}, "swiglu_limit=0.0 is not a positive clamp"),
        ({"sliding_window": None}, "sliding_window=None, but layer_types has sliding_attention layers"),
        ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config="),
    ],
)
def test_a_contradictory_config_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, problem: str
) -> None:
    path = write_config(tmp_path, **changes)
    with pytest.raises(gptzoo.GptzooError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        hf_recipe(path)
    assert main(["compare", "--hf", str(path)]) == 2
    assert problem in capsys.readouterr().err


def export_reasons(recipe: str, overrides: list[str], family: str = "gpt_oss") -> list[str]:
    from gptzoo.model.build import assemble

    spec = gptzoo.load_recipe(recipe, overrides)
    components: list = []
    skeleton = assemble(spec, gptzoo.get_registry(), torch.device("meta"), components)
    with pytest.raises(NoEquivalentError) as excinfo:
        FAMILIES[family].config(spec, skeleton, components)
    return excinfo.value.reasons


def test_what_gpt_oss_cannot_express_is_refused_by_name_and_sinks_elsewhere() -> None:
    assert export_reasons("gpt-oss-tiny", ["model.mlp.glu_limit=0.0", "model.mlp.scoring='softmax'"]) == [
        "mlp 'moe' sets scoring='softmax', which GptOssForCausalLM has no field for",
        "mlp 'moe' sets glu_limit=0.0, which GptOssForCausalLM has no field for",
    ]
    assert export_reasons("gpt-oss-tiny", ["model.attention={name='causal'}"]) == [
        "attention 'causal' does not set sinks=True, which GptOssForCausalLM implies"
    ]
    assert export_reasons("llama-tiny", ["model.attention={name='causal', sinks=true}"], "llama") == [
        "attention 'causal' sets sinks=True, which LlamaForCausalLM has no field for"
    ]


def test_gpt_oss_tiny_exports_to_transformers(tmp_path: Path) -> None:
    model = gptzoo.build_model("gpt-oss-tiny").eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.normal_()
    ids = prompt(model.wte.weight.shape[0], 24)
    gptzoo.hf.export_hf(model, tmp_path / "out")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (theirs(ids).logits - model(ids)).abs().max().item() <= 1e-4


# --- the shipped recipe --------------------------------------------------------------------------------------

OFFICIAL = {  # openai/gpt-oss-20b's config.json, its MXFP4 quantization_config left out (gptzoo refuses it)
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 201088,
}


def test_shipped_recipe_is_the_official_config_with_its_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_shipped_recipe(tmp_path, "gpt-oss-20b", OFFICIAL, capsys) == (20_914_757_184, 4_187_440_704)


def test_recipes_uses_moe_lists_the_gpt_oss_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    listed = {row["name"] for row in run_json(capsys, "recipes", "--uses", "moe")}
    assert {"gpt-oss-20b", "gpt-oss-tiny"} <= listed


def test_sinks_are_transformers_s_s_aux_and_leave_flops_and_kv_bytes_unchanged() -> None:
    """explicit_attention with sinks equals gpt-oss's eager_attention_forward (GQA, a causal mask);
    the sink adds no FLOPs and no cache."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from gptzoo.interfaces import AttentionContext
    from gptzoo_plugins._attentions import CausalSelfAttention, explicit_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    sinks = torch.randn(6) * 2
    mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=3, training=False)
    theirs, _ = eager_attention_forward(module, q, k, v, mask[None, None], scaling=0.3)
    ctx = AttentionContext(start=0, rotary=None, mask=None, is_causal=True)
    ours = explicit_attention(q, k, v, ctx, 0.3, sinks=sinks)
    torch.testing.assert_close(ours.transpose(1, 2), theirs)
    assert not torch.allclose(ours, explicit_attention(q, k, v, ctx, 0.3))
    plain, sunk = (CausalSelfAttention(48, 6, n_kv_head=2, head_dim=8, bias=False, sinks=s) for s in (False, True))
    assert plain.flops(2, 30) == sunk.flops(2, 30)
    assert plain.kv_bytes(2, 30, torch.float32) == sunk.kv_bytes(2, 30, torch.float32)

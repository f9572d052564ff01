"""GPT-NeoX (Pythia), Phi-3 and OLMo 2: parity with transformers on tiny random checkpoints
(tests/hfparity.py: both kernels, cached decoding, export), the maps they need (GPT-NeoX's per-head
interleaved query_key_value), the refusals, and the shipped recipes against the official configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json
from hfparity import check_family, hf_model, prompt, save_hf
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import FAMILIES, NoEquivalentError, check_recipe_matches, export_hf, hf_recipe, load_hf
from gptzoo.hf.compare import compare
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.model.build import assemble
from gptzoo_plugins._norms import RMSNorm

TINY = {
    "vocab_size": 96,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "max_position_embeddings": 64,
}
"""Tiny sizes every family's test model shares: 4 heads of 16 features."""

# The official config.json of each shipped recipe's model (/tmp/research/configs.json, from public copies
# of the Hugging Face files; pythia-160m's are best-known values: they agree with EleutherAI's
# pythia-160m.yml, but no verbatim copy was found).
OFFICIAL = {
    "pythia-160m": {
        "architectures": ["GPTNeoXForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "gelu",
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "model_type": "gpt_neox",
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.24.0",
        "use_cache": True,
        "use_parallel_residual": True,
        "vocab_size": 50304,
    },
    "phi-3-mini": {  # microsoft/Phi-3-mini-4k-instruct (auto_map and _name_or_path left out)
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": 32000,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 4096,
        "model_type": "phi3",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096,
        "pad_token_id": 32000,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.2",
        "use_cache": True,
        "vocab_size": 32064,
    },
    "olmo2-1b": {  # allenai/OLMo-2-0425-1B
        "architectures": ["Olmo2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": 100257,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 4096,
        "model_type": "olmo2",
        "num_attention_heads": 16,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "pad_token_id": 100277,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 500000,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": 100352,
    },
}
PARAMS = {"pythia-160m": 162_322_944, "phi-3-mini": 3_821_079_552, "olmo2-1b": 1_484_916_736}
"""transformers' parameter counts of the official configs (meta device; untied heads, so each counts once)."""


def official_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(OFFICIAL[name]))
    return path


def parity_with_compare(path: Path) -> None:
    """gptzoo compare's own run: float32 logits within 1e-4 and the same 32 greedy tokens."""
    result = compare(path, prompts=[prompt(TINY["vocab_size"], 20)[0].tolist()], new_tokens=32)
    assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"], result


# --- TensorMap groups ------------------------------------------------------------------------------------------


def test_tensor_map_groups_interleave_parts_as_gpt_neox_does() -> None:
    nh, hs, d = 3, 4, 5
    theirs = torch.randn(3 * nh * hs, d)
    heads = theirs.view(nh, 3, hs, d)  # GPT-NeoX: each head's q, k and v rows together
    ours = torch.cat([heads[:, i].reshape(nh * hs, d) for i in range(3)])  # c_attn: q rows, k rows, v rows
    tmap = TensorMap("c_attn.weight", ("query_key_value.weight",), parts=(nh * hs,) * 3, groups=nh)
    assert torch.equal(tmap.load([theirs]), ours)
    assert torch.equal(tmap.save(ours)[0], theirs)
    bias = torch.randn(3 * nh * hs)  # 1-D tensors interleave the same way
    bmap = TensorMap("c_attn.bias", ("query_key_value.bias",), parts=(nh * hs,) * 3, groups=nh)
    assert torch.equal(bmap.load([bias]), torch.cat([bias.view(nh, 3, hs)[:, i].reshape(-1) for i in range(3)]))
    assert torch.equal(bmap.save(bmap.load([bias]))[0], bias)
    # unequal parts (GQA-like) and several tensors of theirs: concatenated first, then un-interleaved
    split = TensorMap("w", ("a", "b"), sizes=(6, 6), parts=(8, 4), groups=2)
    rows = torch.arange(12.0)[:, None]
    assert split.load([rows[:6], rows[6:]]).flatten().tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 4, 5, 10, 11]
    assert torch.equal(torch.cat(split.save(split.load([rows[:6], rows[6:]]))), rows)


def test_a_transposed_tensor_map_interleaves_columns() -> None:
    """gpt-oss's gate_up_proj [in, 2 ff]: gate and up columns alternate; ours is [gate; up] rows."""
    fused = TensorMap("w", ("w",), transpose=True, parts=(3, 3), groups=3)
    ours = torch.arange(12.0).reshape(6, 2)  # rows: gate 0..2, up 0..2
    (theirs,) = fused.save(ours)
    assert theirs.shape == (2, 6) and torch.equal(theirs[:, 0::2], ours[:3].t())
    assert torch.equal(theirs[:, 1::2], ours[3:].t()) and torch.equal(fused.load([theirs]), ours)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"groups": 2}, r"w: groups=2 needs parts \(and parts need groups > 1\)"),
        ({"parts": (4, 4)}, r"w: groups=1 needs parts \(and parts need groups > 1\)"),
        ({"parts": (4, 6), "groups": 4}, r"each of parts \(4, 6\) must split into groups=4 equal slices"),
        ({"stack": 2, "index": 2}, r"w: a slice of one stacked tensor needs 0 <= index < stack=2"),
    ],
    ids=["groups-without-parts", "parts-without-groups", "uneven-parts", "slice-outside-the-stack"],
)
def test_tensor_map_groups_are_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorMap("w", ("w",), **kwargs)
    with pytest.raises(ValueError, match=r"w: 7 rows, but parts \(4, 4\) add up to 8"):
        TensorMap("w", ("w",), parts=(4, 4), groups=2).load([torch.zeros(7)])


# --- parity ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_gpt_neox_matches_transformers(tmp_path: Path, parallel: bool) -> None:
    config = transformers.GPTNeoXConfig(**TINY, rotary_pct=0.25, rotary_emb_base=5000, use_parallel_residual=parallel)
    path = save_hf(tmp_path, "neox", config)
    recipe = check_family(path, length=20)
    assert json.loads((tmp_path / "neox-export" / "config.json").read_text())["model_type"] == "gpt_neox"
    m = recipe.model
    assert m.norm_placement == ("parallel" if parallel else "pre") and m.bias and not m.tie_embeddings
    assert (m.position.name, m.position.kwargs) == ("rope", {"theta": 5000.0, "fraction": 0.25})  # 4 of 16 turn
    assert (m.norm.name, m.mlp.name, m.activation.name) == ("layernorm", "dense", "gelu")
    parity_with_compare(path)


def test_gpt_neox_old_checkpoints_and_the_head_under_either_name(tmp_path: Path) -> None:
    """Older Pythia files carry per-layer mask buffers and rotary tables (ignored); transformers 5 reads
    the head as embed_out or lm_head, and so does gptzoo."""
    path = save_hf(tmp_path, "neox", transformers.GPTNeoXConfig(**TINY))
    expected = load_hf(path).state_dict()
    tensors = load_file(str(path / "model.safetensors"))
    tensors["lm_head.weight"] = tensors.pop("embed_out.weight")
    for i in range(TINY["num_hidden_layers"]):
        layer = f"gpt_neox.layers.{i}.attention."
        tensors[layer + "bias"] = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
        tensors[layer + "masked_bias"] = torch.tensor(-1e9)
        tensors[layer + "rotary_emb.inv_freq"] = torch.ones(2)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    got = load_hf(path).state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


def test_gpt_neox_tied_head(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "neox", transformers.GPTNeoXConfig(**TINY, tie_word_embeddings=True))
    assert "embed_out.weight" not in load_file(str(path / "model.safetensors"))
    model = load_hf(path)
    assert model.tied
    parity_with_compare(path)


def test_phi3_matches_transformers_with_a_window_shorter_than_the_prompt(tmp_path: Path) -> None:
    config = transformers.Phi3Config(
        **TINY, num_key_value_heads=2, sliding_window=6, partial_rotary_factor=0.5, pad_token_id=0
    )
    path = save_hf(tmp_path, "phi3", config)
    recipe = check_family(path, length=30, window=6)  # past 4 x window, where prefill goes by blocks
    assert json.loads((tmp_path / "phi3-export" / "config.json").read_text())["model_type"] == "phi3"
    m = recipe.model
    assert (m.attention.name, m.attention.kwargs) == ("sliding_window", {"window": 6})
    assert (m.n_kv_head, m.position.kwargs, m.bias) == (2, {"theta": 10000.0, "fraction": 0.5}, False)
    parity_with_compare(path)


def test_phi3_without_a_window(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "phi3", transformers.Phi3Config(**TINY, pad_token_id=None))
    assert hf_recipe(path).model.attention.name == "causal"
    parity_with_compare(path)


def test_olmo2_matches_transformers_with_gqa(tmp_path: Path) -> None:
    # a wider init than HF's 0.02: the logits of a tiny random OLMo 2 otherwise nearly tie
    config = transformers.Olmo2Config(**TINY, num_key_value_heads=2, pad_token_id=0, initializer_range=0.1)
    path = save_hf(tmp_path, "olmo2", config)
    recipe = check_family(path, length=20)
    assert json.loads((tmp_path / "olmo2-export" / "config.json").read_text())["model_type"] == "olmo2"
    m = recipe.model
    assert (m.norm_placement, m.n_kv_head, m.attention.kwargs) == ("reordered", 2, {"qk_norm": "full"})
    assert m.norm.kwargs == {"eps": 1e-5, "scale_in_float32": True}
    assert m.position.kwargs == {"theta": 10000.0, "rotate_in_float32": True}
    parity_with_compare(path)
    # in bfloat16 too: the norm scales and RoPE rotates in float32 before rounding, as OLMo 2 does
    bf16 = compare(path, prompts=[prompt(TINY["vocab_size"], 20)[0].tolist()], new_tokens=16, dtype=torch.bfloat16)
    assert bf16["max_abs_diff"] == 0.0 and bf16["greedy_match"], bf16


def test_rmsnorm_scale_in_float32_is_olmo2s_numerics() -> None:
    """In bfloat16, scale_in_float32 computes OLMo 2's RMSNorm bit for bit and the default Llama's; the
    two differ there (they agree in float32)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    x = torch.randn(4, 8, 64).bfloat16()
    weight = (1 + 0.3 * torch.randn(64)).bfloat16()
    outputs = {}
    for name, ours, theirs in (
        ("olmo2", RMSNorm(64, eps=1e-6, scale_in_float32=True), Olmo2RMSNorm(64, eps=1e-6)),
        ("llama", RMSNorm(64, eps=1e-6), LlamaRMSNorm(64, eps=1e-6)),
    ):
        for norm in (ours, theirs):
            norm.bfloat16().weight.data.copy_(weight)
        outputs[name] = ours(x)
        assert torch.equal(outputs[name], theirs(x)), name
    assert not torch.equal(outputs["olmo2"], outputs["llama"])
    assert torch.equal(RMSNorm(64, scale_in_float32=True)(x.float()), RMSNorm(64)(x.float()))


# --- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}},
            "config.json rope_scaling type 'longrope' is not supported: gptzoo has no longrope, the RoPE of Phi-3's "
            "long-context variants; use a 4k-context Phi-3",
        ),
        (
            {"model_type": "phi3", "rope_scaling": {"type": "su", "long_factor": [1.0] * 8}},
            "config.json rope_scaling type 'su' (longrope to transformers) is not supported: gptzoo has no longrope, "
            "the RoPE of Phi-3's long-context variants; use a 4k-context Phi-3",
        ),
        (
            {"model_type": "phi3", "rope_parameters": {"rope_type": "linear", "factor": 2.0}},
            "config.json rope_parameters type 'linear' is not supported (Phi-3 takes default or longrope)",
        ),
        (
            {"model_type": "gpt_neox", "attention_bias": False},
            "config.json attention_bias=false is not supported (GPT-NeoX's MLP always has biases, and gptzoo's bias "
            "covers the attention and the MLP alike)",
        ),
        (
            {"model_type": "olmo2", "attention_bias": True},
            "config.json attention_bias=true is not supported (OLMo 2's MLP has no biases, and gptzoo's bias covers "
            "the attention and the MLP alike)",
        ),
    ],
    ids=["phi3-longrope", "phi3-su", "phi3-linear", "neox-attention-bias", "olmo2-attention-bias"],
)
def test_config_fields_gptzoo_lacks_are_refused_by_name(tmp_path: Path, config: dict, problem: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, **config}))
    with pytest.raises(RecipeError) as excinfo:
        hf_recipe(tmp_path)
    assert str(excinfo.value) == f"{tmp_path / 'config.json'}: {problem}"


SMALL = """[model]
n_layer = 2
vocab_size = 64
context_length = 64
n_embd = 32
n_head = 2
d_ff = 48
"""
SMALL_SETS = tuple(f"model.{line.replace(' ', '')}" for line in SMALL.splitlines()[1:])
"""SMALL as --set overrides."""
TWO_TYPES = SMALL + 'layer_pattern = ["a", "b"]\n[model.layer_types.a]\n[model.layer_types.b]\n'


@pytest.mark.parametrize(
    ("family", "recipe", "reasons"),
    [
        (
            "olmo2",
            'extends = "olmo2-1b"\n' + SMALL + 'norm = { name = "rmsnorm", eps = 1e-6 }\n',
            "Olmo2ForCausalLM implies rms_norm_scale_in_float32=True, which no component gives",
        ),
        (  # one layer type's norm with Llama's numerics beside OLMo 2's
            "olmo2",
            'extends = "olmo2-1b"\n' + TWO_TYPES + 'norm = { name = "rmsnorm", eps = 1e-6 }\n',
            "norm 'rmsnorm' does not set rms_norm_scale_in_float32=True, which Olmo2ForCausalLM implies",
        ),
        (
            "olmo2",
            'extends = "olmo2-1b"\n' + SMALL + 'attention = { name = "causal", qk_norm = "head" }\n',
            "attention 'causal' sets qk_norm='head', Olmo2ForCausalLM has 'full'",
        ),
        (
            "phi3",
            'extends = "phi-3-mini"\n' + TWO_TYPES + 'attention = "causal"\n',
            "sliding_window differs between layers (2047, none); Phi-3's applies to every layer",
        ),
        (
            "phi3",
            'extends = "phi-3-mini"\n' + SMALL + 'position = { name = "rope_linear", factor = 2.0 }\n',
            "position 'rope_linear' sets rope_scaling={'rope_type': 'linear', 'factor': 2.0}, which Phi3ForCausalLM "
            "has no field for",
        ),
        (
            "phi3",
            'extends = "phi-3-mini"\n' + SMALL + "bias = true\n",
            "bias=true (Phi-3 has no biases); mlp 'gated' (its 'phi3' layout refuses its parameters: "
            "Phi3ForCausalLM has no equivalent of it)",
        ),
        (
            "gpt_neox",
            'extends = "pythia-160m"\n' + SMALL.replace("n_head = 2", "n_head = 4") + "n_kv_head = 2\n",
            "n_kv_head=2, head_dim=8 (GPT-NeoX has n_head heads of n_embd/n_head); attention 'causal' (its "
            "'gpt_neox' layout refuses its parameters: GPTNeoXForCausalLM has no equivalent of it)",
        ),
        (
            "gpt_neox",
            'extends = "pythia-160m"\n' + SMALL + 'attention = { name = "sliding_window", window = 8 }\n',
            "attention 'sliding_window' sets sliding_window=8, which GPTNeoXForCausalLM has no field for",
        ),
        (
            "gpt_neox",
            'extends = "pythia-160m"\n' + SMALL + 'norm_placement = "reordered"\n',
            "norm_placement 'reordered' (GPT-NeoX is parallel, or pre with use_parallel_residual=false)",
        ),
    ],
    ids=[
        "olmo2-llama-norm",
        "olmo2-layer-type-llama-norm",
        "olmo2-head-qk-norm",
        "phi3-windows-differ",
        "phi3-scaled-rope",
        "phi3-bias",
        "neox-gqa",
        "neox-window",
        "neox-placement",
    ],
)
def test_recipes_a_family_cannot_express_are_refused(tmp_path: Path, family: str, recipe: str, reasons: str) -> None:
    (tmp_path / "mine.toml").write_text(recipe)
    loaded = gptzoo.load_recipe(tmp_path / "mine.toml")
    components: list = []
    skeleton = assemble(loaded, gptzoo.get_registry(), torch.device("meta"), components)
    with pytest.raises(NoEquivalentError) as excinfo:
        FAMILIES[family].config(loaded, skeleton, components)
    assert str(excinfo.value) == f"recipe 'mine' has no Hugging Face {FAMILIES[family].title} equivalent: {reasons}"


# --- shipped recipes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_is_the_official_config(tmp_path: Path, name: str) -> None:
    """The shipped recipe is what config.json derives, field for field (kernels included: Phi-3's sliding
    window is its attention), and gptzoo check_recipe_matches agrees."""
    shipped, derived = gptzoo.load_recipe(name), hf_recipe(official_dir(tmp_path, name))
    assert shipped.model == derived.model
    assert shipped.tokenizer == derived.tokenizer
    check_recipe_matches(shipped, derived, gptzoo.get_registry())


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_has_the_official_parameter_count(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = transformers.AutoConfig.for_model(**OFFICIAL[name])
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in theirs.parameters()) == PARAMS[name]
    assert run_json(capsys, "build", name)["params"]["total"] == PARAMS[name]


def test_export_writes_what_transformers_reads_back(tmp_path: Path) -> None:
    """Export takes the first family that fits: a Phi-3 recipe with whole-head RoPE goes to Mistral (Llama
    without its window), which computes the same; partial rotary makes it Phi-3's. Phi-3's pad_token_id is
    written as null (Phi3Config's default 32000 is no token of a small vocabulary, and transformers
    would not build the model). GPT-NeoX's rotary_pct is written even when it is 1 (its default is 0.25)."""
    partial = 'model.position={name="rope",theta=10000.0,fraction=0.5}'
    for overrides, model_type in (([], "mistral"), (['model.attention="causal"'], "llama"), ([partial], "phi3")):
        model = gptzoo.build_model(gptzoo.load_recipe("phi-3-mini", [*SMALL_SETS, *overrides]))
        out = tmp_path / f"phi-{model_type}"
        export_hf(model, out)
        assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    config = json.loads((tmp_path / "phi-phi3" / "config.json").read_text())
    assert config["pad_token_id"] is None and config["sliding_window"] == 2047
    assert hf_model(tmp_path / "phi-phi3", "sdpa").config.rope_parameters["partial_rotary_factor"] == 0.5
    neox = gptzoo.build_model(
        gptzoo.load_recipe("pythia-160m", [*SMALL_SETS, 'model.position={name="rope",theta=10000.0}'])
    )
    export_hf(neox, tmp_path / "neox")
    assert hf_model(tmp_path / "neox", "sdpa").config.rope_parameters["partial_rotary_factor"] == 1.0
    assert load_hf(tmp_path / "neox").recipe.model.position.kwargs == {"theta": 10000.0}

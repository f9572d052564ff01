"""Qwen2 (Qwen2.5), Qwen3 and Mistral: parity with transformers on tiny random checkpoints whose prompts
outrun their sliding windows (tests/hfparity.py runs every check), how config.json's window fields
are read and written, refusals by name, and the shipped recipes against the official configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hfparity import check_family, prompt, save_hf

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import FAMILIES, NoEquivalentError, check_recipe_matches, export_hf, hf_recipe, load_hf
from gptzoo.hf.compare import compare
from gptzoo.model.build import assemble
from gptzoo.model.summary import parameter_counts
from gptzoo.recipe import Recipe, load_recipe

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 5000.0,
}
"""A tiny Llama-shaped config: GQA 4/2, head_dim 16, non-default eps and theta (so a field read from
the wrong place shows)."""
WINDOW = 8
LENGTH = 40
"""Prompts of LENGTH tokens outrun the WINDOW-key sliding windows, and so do their greedy continuations;
beyond 4 x WINDOW, gptzoo's sliding-window pass is computed in blocks (gptzoo_plugins._attentions)."""


def tiny(model_type: str, **kw: Any) -> transformers.PretrainedConfig:
    return transformers.AutoConfig.for_model(model_type, **{**TINY, **kw})


def write_config(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def windows(recipe: Recipe) -> list[int | None]:
    """Each layer's sliding window (None: full attention)."""
    return [dict(recipe.model.layer_components(t)["attention"].params).get("window") for t in recipe.model.schedule()]


def exported_config(model: gptzoo.GPT, out: Path) -> dict[str, Any]:
    export_hf(model, out)
    return json.loads((out / "config.json").read_text())


# --- parity (logits, greedy tokens, cached decoding across the window, export) -------------------------


QWEN2_CASES = {
    # layers 2 and 3 slide (max_window_layers), the head is tied
    "mixed": (
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2, "tie_word_embeddings": True},
        [None, None, WINDOW, WINDOW],
    ),
    # transformers 5's layer_types win over max_window_layers; an explicit head_dim (Qwen2 reads it)
    "layer_types": (
        {
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 3,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "head_dim": 32,
        },
        [WINDOW, None, WINDOW, None],
    ),
    # use_sliding_window false: sliding_window is ignored (as in Qwen2.5-0.5B's config.json)
    "no window": ({"use_sliding_window": False, "sliding_window": WINDOW, "max_window_layers": 0}, [None] * 4),
}


@pytest.mark.parametrize("case", QWEN2_CASES)
def test_qwen2_matches_transformers(tmp_path: Path, case: str) -> None:
    fields, expected = QWEN2_CASES[case]
    path = save_hf(tmp_path, "qwen2", tiny("qwen2", **fields))
    recipe = check_family(path, length=LENGTH, window=WINDOW if any(expected) else 0)
    assert windows(recipe) == expected
    assert recipe.model.bias is False and dict(recipe.model.attention.params)["qkv_bias"] is True
    config = json.loads((tmp_path / "qwen2-export" / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["use_sliding_window"] is any(expected)
    assert config["layer_types"] == ["full_attention" if w is None else "sliding_attention" for w in expected]
    assert config["sliding_window"] == (WINDOW if any(expected) else None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1, "head_dim": 32},
            [None] + [WINDOW] * 3,
        ),
        ({"tie_word_embeddings": True}, [None] * 4),  # head_dim: Qwen3's default 128, not 64 / 4
    ],
    ids=["sliding", "default head_dim"],
)
def test_qwen3_matches_transformers(tmp_path: Path, fields: dict[str, Any], expected: list[int | None]) -> None:
    path = save_hf(tmp_path, "qwen3", tiny("qwen3", **fields))
    recipe = check_family(path, length=LENGTH, window=WINDOW if any(expected) else 0)
    assert windows(recipe) == expected
    assert recipe.model.head_dim == fields.get("head_dim", 128)
    assert dict(recipe.model.attention.params) == {"qk_norm": "head"}
    config = json.loads((tmp_path / "qwen3-export" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == recipe.model.head_dim
    assert config["attention_bias"] is False


@pytest.mark.parametrize("window", [WINDOW, None], ids=["sliding", "no window"])
def test_mistral_matches_transformers(tmp_path: Path, window: int | None) -> None:
    path = save_hf(tmp_path, "mistral", tiny("mistral", sliding_window=window))
    recipe = check_family(path, length=LENGTH, window=window or 0)
    assert windows(recipe) == [window] * 4
    config = json.loads((tmp_path / "mistral-export" / "config.json").read_text())
    # without a window the recipe is plain Llama, which export tries first
    assert (config["model_type"], config.get("sliding_window")) == (("mistral", window) if window else ("llama", None))


def test_mistral_writes_a_null_window_explicitly() -> None:
    """MistralConfig would take an absent sliding_window for 4096."""
    recipe = tiny_recipe()
    components: list[Any] = []
    skeleton = assemble(recipe, gptzoo.get_registry(), torch.device("meta"), components)
    fields = FAMILIES["mistral"].config(recipe, skeleton, components)
    assert "sliding_window" in fields and fields["sliding_window"] is None
    assert transformers.AutoConfig.for_model("mistral", **fields).sliding_window is None


def test_compare_runs_each_family(tmp_path: Path) -> None:
    """`gptzoo compare` (its Python side, on token ids: these checkpoints have no tokenizer)."""
    for model_type, fields in [
        ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2}),
        ("qwen3", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2, "head_dim": 16}),
        ("mistral", {"sliding_window": WINDOW}),
    ]:
        path = save_hf(tmp_path, model_type, tiny(model_type, **fields))
        result = compare(path, prompts=[prompt(TINY["vocab_size"], LENGTH)[0].tolist()], new_tokens=8)
        assert result["max_abs_diff"] <= 1e-4 and result["greedy_match"] is True, (model_type, result)


# --- how config.json's window fields are read ------------------------------------------------------------


def test_mistral_without_the_key_has_mistralconfigs_4096_window(tmp_path: Path) -> None:
    config = {"model_type": "mistral", **TINY, "max_position_embeddings": 8192}
    assert windows(hf_recipe(write_config(tmp_path, "absent", config))) == [4096] * 4
    assert windows(hf_recipe(write_config(tmp_path, "null", {**config, "sliding_window": None}))) == [None] * 4
    assert transformers.MistralConfig(**TINY).sliding_window == 4096  # what the first one relies on


def test_class_defaults_of_absent_fields_are_transformers(tmp_path: Path) -> None:
    """Each family's own defaults: Qwen's 32 key/value heads and Mistral's 8 (not one per query head),
    Qwen3's head_dim 128, the context lengths; null key/value heads mean one per query head."""
    sizes = {"hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512}
    for model_type, heads, expected in [
        ("qwen2", 32, (32, 4, 32768)),
        ("qwen3", 32, (32, 128, 32768)),
        ("mistral", 16, (8, 8, 131072)),
    ]:
        config = {"model_type": model_type, **sizes, "num_attention_heads": heads}
        hf = transformers.AutoConfig.for_model(**config)
        assert (hf.num_key_value_heads, getattr(hf, "head_dim", 128 // heads), hf.max_position_embeddings) == expected
        m = hf_recipe(write_config(tmp_path, model_type, config)).model
        assert (m.n_kv_head, m.head_dim, m.context_length) == expected
        m = hf_recipe(write_config(tmp_path, f"{model_type}-null", {**config, "num_key_value_heads": None})).model
        assert m.n_kv_head == heads


def test_qwen2_slides_from_max_window_layers_and_writes_it_back(tmp_path: Path) -> None:
    config = {"model_type": "qwen2", **TINY, "num_hidden_layers": 6, "use_sliding_window": True, "sliding_window": 16}
    for first, expected, pattern in [
        (4, [None] * 4 + [16] * 2, ["full"] * 4 + ["sliding"] * 2),
        (0, [16] * 6, []),
        (6, [None] * 6, []),
        (None, [None] * 6, []),  # transformers' default 28: no layer of 6 slides
    ]:
        fields = config if first is None else {**config, "max_window_layers": first}
        recipe = hf_recipe(write_config(tmp_path, str(first), fields))
        assert (windows(recipe), list(recipe.model.layer_pattern)) == (expected, pattern)
    # every layer sliding is [model]'s own attention; export says so with max_window_layers 0
    recipe = hf_recipe(tmp_path / "0")
    assert dict(recipe.model.attention.params) == {"qkv_bias": True, "window": 16}
    model = gptzoo.build_model(recipe)
    config = exported_config(model, tmp_path / "out")
    assert (config["use_sliding_window"], config["sliding_window"], config["max_window_layers"]) == (True, 16, 0)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").layer_types == ["sliding_attention"] * 6


# --- refusals ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"model_type": "qwen3", "attention_bias": True},
            "config.json attention_bias=true is not supported (its biases on q, k, v and o but not on the MLP have "
            "no gptzoo equivalent: gptzoo's bias covers the MLP too)",
        ),
        (
            {"model_type": "qwen2", "layer_types": ["sliding_attention", "full_attention"] * 2},
            "config.json layer_types has 'sliding_attention' layers but no window (use_sliding_window=False, "
            "sliding_window=None; transformers refuses it too): set use_sliding_window to true and sliding_window, "
            "or make them 'full_attention'",
        ),
        (
            {"model_type": "qwen3", "use_sliding_window": True, "layer_types": ["sliding_attention", "chunked"]},
            "config.json layer_types=['sliding_attention', 'chunked'] is not a list of 4 'sliding_attention' or "
            "'full_attention' entries",
        ),
        (
            {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": -1},
            "config.json max_window_layers=-1 is not an integer >= 0",
        ),
        (
            {"model_type": "mistral", "sliding_window": 0},
            "config.json sliding_window=0 is not a positive integer",
        ),
        (
            {"model_type": "mistral", "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}},
            "config.json rope scaling type 'longrope' is not supported (gptzoo implements default, linear, dynamic, "
            "llama3, yarn)",
        ),
        (
            {"model_type": "qwen2", "quantization_config": {"quant_method": "gptq"}},
            "config.json quantization_config={'quant_method': 'gptq'} is not supported (gptzoo reads plain",
        ),
        (
            {"model_type": "mistral", "sliding_window": 6, "layer_types": ["full_attention"] * 3},
            "config.json layer_types=['full_attention', 'full_attention', 'full_attention'] is not supported for "
            "Mistral (MistralForCausalLM slides every layer when sliding_window is set and none otherwise)",
        ),
        (
            {"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            "config.json rope scaling type 'yarn' needs factor, and has none",
        ),
    ],
    ids=[
        "qwen3 attention_bias",
        "sliding without window",
        "layer_types",
        "max_window_layers",
        "window 0",
        "rope",
        "quantized",
        "mistral layer_types",
        "yarn without factor",
    ],
)
def test_unsupported_config_values_are_refused_by_name(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    path = write_config(tmp_path, "c", {**TINY, **config})
    with pytest.raises(RecipeError) as info:
        hf_recipe(path)
    assert info.value.problems[0].startswith(message), info.value.problems


def refusal(family: str, recipe: Recipe) -> list[str]:
    """Why ``family`` cannot express ``recipe`` (export tries each family this way)."""
    registry = gptzoo.get_registry()
    components: list[Any] = []
    skeleton = assemble(recipe, registry, torch.device("meta"), components)
    with pytest.raises(NoEquivalentError) as info:
        FAMILIES[family].config(recipe, skeleton, components)
    return info.value.reasons


def tiny_recipe(*overrides: str) -> Recipe:
    return load_recipe("llama-tiny", ["model.n_layer=4", *overrides])


SLIDING_EVERY_OTHER = ["model.layer_pattern=['sliding', 'full']", "model.layer_types.full.attention=causal"]


@pytest.mark.parametrize(
    ("family", "overrides", "reasons"),
    [
        (
            "mistral",
            [*SLIDING_EVERY_OTHER, "model.layer_types.sliding.attention={name='sliding_window', window=8}"],
            ["no sliding window on layers 1, 3, one on the others (Mistral slides every layer or none)"],
        ),
        (
            "mistral",
            [
                "model.layer_pattern=['a', 'b']",
                "model.layer_types.a.attention={name='sliding_window', window=8}",
                "model.layer_types.b.attention={name='sliding_window', window=16}",
            ],
            ["sliding_window differs between layers (8, 16); the family has one"],
        ),
        ("mistral", ["model.bias=true"], ["bias=true (Mistral has no biases)"]),
        (
            "mistral",
            ["model.attention={name='causal', qkv_bias=true}"],
            ["attention 'causal' sets qkv_bias=True, which MistralForCausalLM has no field for"],
        ),
        ("qwen2", [], ["Qwen2ForCausalLM implies qkv_bias=True, which no component gives"]),
        (
            "qwen2",
            ["model.bias=true"],
            [
                "bias=true (Qwen2 has biases on q, k and v only: set bias=false and the attention's qkv_bias=true)",
                "Qwen2ForCausalLM implies qkv_bias=True, which no component gives",
            ],
        ),
        (
            "qwen2",
            [
                "model.attention={name='causal', qkv_bias=true}",
                *SLIDING_EVERY_OTHER,
                "model.layer_types.full.attention={name='causal', qkv_bias=true}",
                "model.layer_types.sliding.attention={name='sliding_window', window=8, qkv_bias=true}",
                "model.layer_types.sliding.position={theta=100.0}",
            ],
            ["position 'rope' sets rope_theta=10000.0, position 'rope' sets rope_theta=100.0"],
        ),
        (
            "qwen3",
            ["model.attention={name='causal', qk_norm='full'}"],
            ["attention 'causal' sets qk_norm='full', Qwen3ForCausalLM has 'head'"],
        ),
        (
            "qwen3",
            ["model.attention={name='causal', qk_norm='head', qkv_bias=true}"],
            ["attention 'causal' sets qkv_bias=True, which Qwen3ForCausalLM has no field for"],
        ),
        (
            "qwen3",
            ["model.attention={name='causal', qk_norm='head'}", "model.position={name='rope', fraction=0.5}"],
            ["position 'rope' sets partial_rotary_factor=0.5, which Qwen3ForCausalLM has no field for"],
        ),
        (
            "qwen3",
            ["model.attention={name='causal', qk_norm='head'}", "model.bias=true"],
            [
                "bias=true (Qwen3's attention_bias puts biases on q, k, v and o and never on the MLP, and gptzoo's "
                "bias covers the MLP too)"
            ],
        ),
    ],
)
def test_recipes_a_family_cannot_express_are_refused_by_name(
    family: str, overrides: list[str], reasons: list[str]
) -> None:
    assert refusal(family, tiny_recipe(*overrides)) == reasons


def test_export_picks_the_family_the_recipe_fits(tmp_path: Path) -> None:
    cases = {
        "qwen2": ["model.attention={name='causal', qkv_bias=true}"],
        "qwen3": ["model.attention={name='causal', qk_norm='head'}"],  # head_dim 16, not 128: written
        "mistral": ["model.attention={name='sliding_window', window=8}"],
        "llama": [],
    }
    for model_type, overrides in cases.items():
        model = gptzoo.build_model(tiny_recipe(*overrides))
        assert exported_config(model, tmp_path / model_type)["model_type"] == model_type
        assert load_hf(tmp_path / model_type).recipe.model == model.recipe.model


# --- the shipped recipes against the official configs ---------------------------------------------------

OFFICIAL: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {  # Qwen/Qwen2.5-0.5B, commit 060db649
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3-0.6b": {  # Qwen/Qwen3-0.6B: best-known values (partial copies agree; no verbatim file found)
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "mistral-7b": {  # mistralai/Mistral-7B-v0.1
        "architectures": ["MistralForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0",
        "use_cache": True,
        "vocab_size": 32000,
    },
}
PARAMS = {"qwen2.5-0.5b": 494_032_768, "qwen3-0.6b": 596_049_920, "mistral-7b": 7_241_732_096}
"""transformers' counts (a tied head once): Qwen2.5-0.5B's is the one Qwen quotes."""


def hf_parameters(config: dict[str, Any]) -> int:
    fields = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(config["model_type"], **fields)
        )
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_has_the_official_parameter_count(name: str) -> None:
    ours = parameter_counts(gptzoo.build_model(name, device="meta"))["total"]
    assert ours == hf_parameters(OFFICIAL[name]) == PARAMS[name]


@pytest.mark.parametrize("name", OFFICIAL)
def test_shipped_recipe_is_the_official_config(tmp_path: Path, name: str) -> None:
    """Field by field: [model] is exactly the recipe derived from config.json; only the shipped
    recipe's [weights] (the hub name) and description differ."""
    shipped = load_recipe(name)
    derived = hf_recipe(write_config(tmp_path, name, OFFICIAL[name]))
    check_recipe_matches(shipped, derived, gptzoo.get_registry())
    ours, theirs = shipped.to_dict(), derived.to_dict()
    assert ours["model"] == theirs["model"] and ours["tokenizer"] == theirs["tokenizer"]
    assert set(ours) - set(theirs) == {"weights"}
    # and export writes the official config back (what each family writes; weights need no allocation)
    recipe = shipped
    components: list[Any] = []
    skeleton = assemble(recipe, gptzoo.get_registry(), torch.device("meta"), components)
    fields = FAMILIES[OFFICIAL[name]["model_type"]].config(recipe, skeleton, components)
    official = transformers.AutoConfig.for_model(**OFFICIAL[name]).to_dict()
    exported = transformers.AutoConfig.for_model(OFFICIAL[name]["model_type"], **fields).to_dict()
    for key in (
        "sliding_window",
        "use_sliding_window",
        "layer_types",
        "rope_parameters",
        "head_dim",
        "tie_word_embeddings",
    ):
        assert exported.get(key) == official.get(key), key


def test_compare_names_the_config_transformers_refuses(tmp_path: Path) -> None:
    """gptzoo reads a null max_window_layers as absent; transformers' config validation refuses it, and
    compare says config.json (not the tokenizer it would have loaded first)."""
    path = save_hf(tmp_path, "q2", tiny("qwen2"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_window_layers": None}))
    with pytest.raises(gptzoo.CheckpointError) as info:
        compare(path, prompts=["a prompt"], new_tokens=2)
    assert str(info.value).startswith(f"transformers refuses {path}/config.json: StrictDataclassFieldValidationError")

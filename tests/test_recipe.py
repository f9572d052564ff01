"""Recipes: shipped ones build with the official sizes; bad ones report every problem at once."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.model.gpt import BLOCKS
from gptzoo.model.summary import parameter_counts
from gptzoo.recipe import load_recipe, shipped_recipes
from gptzoo.recipe.schema import NORM_PLACEMENTS

SHIPPED = sorted(shipped_recipes())

# Hugging Face's parameter counts of GPT2LMHeadModel (tied head counted once).
GPT2_PARAMS = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


def test_shipped_recipes_are_the_promised_ones() -> None:
    assert {
        "gpt2-small",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "gpt2-small-postln",
        "tinyllama-1.1b",
        "gpt2-tiny",
        "llama-tiny",
    } <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_builds(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.name == name and recipe.description
    model = gptzoo.build_model(recipe, device="meta")
    n = recipe.model.n_layer
    assert len(model.blocks) == n
    out = model(torch.zeros(1, 4, dtype=torch.long, device="meta"))
    assert out.shape == (1, 4, recipe.model.vocab_size)


@pytest.mark.parametrize(("name", "expected"), GPT2_PARAMS.items())
def test_gpt2_parameter_counts_match_hugging_face(name: str, expected: int) -> None:
    model = gptzoo.build_model(name, device="meta")
    assert parameter_counts(model)["total"] == expected


def test_llama_recipe_matches_hf_llama_parameter_count() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = load_recipe("tinyllama-1.1b").model
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.n_embd,
        intermediate_size=spec.d_ff,
        num_hidden_layers=spec.n_layer,
        num_attention_heads=spec.n_head,
        num_key_value_heads=spec.n_kv_head,
        max_position_embeddings=spec.context_length,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    ours = gptzoo.build_model("tinyllama-1.1b", device="meta")
    expected = sum(p.numel() for p in hf.parameters())
    assert parameter_counts(ours)["total"] == expected == 1_100_048_384


def test_placements_and_blocks_agree() -> None:
    assert set(NORM_PLACEMENTS) == set(BLOCKS)


def test_extends_and_overrides() -> None:
    medium = load_recipe("gpt2-medium")
    small = load_recipe("gpt2-small")
    assert (medium.model.n_layer, medium.model.n_embd) == (24, 1024)
    assert medium.model.norm == small.model.norm and medium.model.vocab_size == 50257
    r = load_recipe("gpt2-small", ["model.n_layer=6", "model.norm=rmsnorm", "model.norm.eps=1e-6", "model.bias=false"])
    assert r.model.n_layer == 6 and r.model.bias is False
    assert r.model.norm.name == "rmsnorm" and dict(r.model.norm.params) == {"eps": 1e-6}
    r = load_recipe("gpt2-small", ["model.position.theta=5e5", "model.position=rope"])
    assert r.model.position.name == "rope" and dict(r.model.position.params) == {}  # a later name replaces the table


def test_recipe_files_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.toml").write_text('extends = "../base.toml"\n[model]\nn_layer = 3\n')
    (tmp_path / "base.toml").write_text('extends = "gpt2-tiny"\ndescription = "mine"\n[model]\nposition = "rope"\n')
    monkeypatch.chdir("/")
    assert load_recipe("gpt2-medium").model.n_layer == 24  # shipped names resolve from anywhere
    r = load_recipe(tmp_path / "sub" / "mine.toml")
    assert (r.name, r.model.n_layer, r.model.position.name, r.model.n_embd, r.description) == (
        "mine",
        3,
        "rope",
        64,
        "mine",
    )


def test_resolved_recipe_round_trips_through_toml(tmp_path: Path) -> None:
    r = load_recipe("tinyllama-1.1b", ["model.norm.eps=1e-6"])
    text = r.to_toml()
    data = tomllib.loads(text)
    assert data["model"]["norm"] == {"name": "rmsnorm", "eps": 1e-6}
    assert data["model"]["n_kv_head"] == 4 and "head_dim" not in data["model"]  # a default stays implicit
    (tmp_path / "again.toml").write_text(text)
    assert load_recipe(tmp_path / "again.toml").model == r.model


def _problems(tmp_path: Path, text: str, overrides: list[str] | None = None) -> list[str]:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides or [])
    assert info.value.source == str(path.resolve())
    return info.value.problems


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """
extends = "gpt2-small"
[model]
n_embd = 100
n_layers = 2
bias = "yes"
norm = "rmsnrom"
attention = { name = "causal", dropout = 0.1 }
position = { name = "rope", theta = "big" }
norm_placement = "middle"
[tokeniser]
name = "gpt2"
""",
    )
    assert problems == [
        "unknown section or key 'tokeniser'; did you mean 'tokenizer'? (available: model, tokenizer, weights, generate, train, extends, description)",
        "[model] unknown key 'n_layers'; did you mean 'n_layer'? (available: vocab_size, context_length, n_layer, n_head, n_embd, d_ff, bias, tie_embeddings, norm, activation, mlp, position, attention, norm_placement, n_kv_head, head_dim, init_std)",
        "[model] bias must be true or false, got 'yes' (str)",
        "[model] norm: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? (available: layernorm, rmsnorm)",
        "[model] position.theta must be a number, got 'big' (str)",
        "[model] attention.dropout: attention 'causal' has no parameter 'dropout' (it takes none)",
        "[model] norm_placement='middle' must be one of 'pre', 'post'",
        "[model] n_embd=100 is not divisible by n_head=12 (or set head_dim explicitly)",
    ]


def test_component_parameter_problems(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        'extends = "llama-tiny"\n[model]\nattention = { name = "causal", dropout = 0.1 }\nposition = { name = "rope", theta = "big" }\n',
    )
    assert problems == [
        "[model] position.theta must be a number, got 'big' (str)",
        "[model] attention.dropout: attention 'causal' has no parameter 'dropout' (it takes none)",
    ]
    problems = _problems(tmp_path, 'extends = "gpt2-tiny"\n[model]\nnorm = { name = "layernorm", epsilon = 1e-6 }\n')
    assert problems == [
        "[model] norm.epsilon: norm 'layernorm' has no parameter 'epsilon'; did you mean 'eps'? (available: eps, bias)"
    ]
    problems = _problems(
        tmp_path, 'extends = "llama-tiny"\n[model]\nn_embd = 60\nposition = { name = "rope", theta = -1.0 }\n'
    )
    assert problems == [
        "[model] position (rope): rope needs an even head_dim, got 15",
        "[model] position (rope): rope theta must be a positive number, got -1.0",
    ]


def test_dimension_problems(tmp_path: Path) -> None:
    problems = _problems(tmp_path, 'extends = "llama-tiny"\n[model]\nn_kv_head = 3\nn_layer = 0\nd_ff = -4\n')
    assert problems == [
        "[model] n_layer=0 must be between 1 and 2147483647",
        "[model] d_ff=-4 must be between 1 and 2147483647",
        "[model] n_head=4 is not divisible by n_kv_head=3",
    ]
    problems = _problems(tmp_path, "[model]\nn_layer = 2\n")
    assert problems[0] == "[model] vocab_size is missing" and len(problems) == 12
    assert _problems(tmp_path, 'description = "x"\n') == ["[model] section is missing"]


def test_extends_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(RecipeError, match=r"extends cycle: a.toml -> b.toml -> a.toml"):
        load_recipe(tmp_path / "a.toml")


def test_unknown_recipe_names_and_files(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"unknown recipe 'gpt2-smal'; did you mean 'gpt2-small'\?"):
        load_recipe("gpt2-smal")
    with pytest.raises(RecipeError, match=r"no such recipe file"):
        load_recipe(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("[model\n")
    with pytest.raises(RecipeError, match=r"broken.toml: invalid TOML: "):
        load_recipe(tmp_path / "broken.toml")


def test_bad_overrides() -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe("gpt2-tiny", ["n_layer=6", "model.a.b.c=1", "model.n_head=3"])
    assert info.value.problems == [
        "--set 'n_layer=6' is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)",
        "--set 'model.a.b.c=1' is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)",
        "[model] n_embd=64 is not divisible by n_head=3 (or set head_dim explicitly)",
    ]
    with pytest.raises(RecipeError, match=r"\[model\] n_layer must be an integer, got 'six' \(str\)"):
        load_recipe("gpt2-tiny", ["model.n_layer=six"])
    with pytest.raises(RecipeError, match=r"\[model\] unknown key 'n_layers'"):
        load_recipe("gpt2-tiny", ["model.n_layers=6"])


def test_component_parameter_values_are_checked_before_building(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(
            "gpt2-tiny",
            [
                "model.norm.eps=-1.0",
                "model.position=sinusoidal",
                "model.position.base=0.5",
                "model.activation.approximate=foo",
            ],
        )
    assert info.value.problems == [
        "[model] activation.approximate: activation 'gelu_tanh' has no parameter 'approximate' (it takes none)",
    ]
    with pytest.raises(RecipeError) as info:
        load_recipe("gpt2-tiny", ["model.norm.eps=nan", "model.position=sinusoidal", "model.position.base=0.5"])
    assert info.value.problems == [
        "[model] norm (layernorm): eps must be a positive number, got nan",
        "[model] position (sinusoidal): base must be a number > 1, got 0.5",
    ]
    with pytest.raises(RecipeError, match=r"rope theta must be a positive number, got nan"):
        load_recipe("llama-tiny", ["model.position.theta=nan"])
    with pytest.raises(RecipeError, match=r"eps must be a positive number, got 0.0"):
        load_recipe("llama-tiny", ["model.norm.eps=0.0"])


def test_oversized_and_unreadable_recipes(tmp_path: Path) -> None:
    with pytest.raises(
        RecipeError, match=r"\[model\] vocab_size=99999999999999999999 must be between 1 and 2147483647"
    ):
        load_recipe("gpt2-tiny", ["model.vocab_size=99999999999999999999"])
    (tmp_path / "latin1.toml").write_bytes(b"\xff[model]\n")
    with pytest.raises(RecipeError, match=r"latin1.toml: invalid TOML: 'utf-8' codec can't decode"):
        load_recipe(tmp_path / "latin1.toml")
    (tmp_path / "child.toml").write_text('extends = "missing.toml"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "child.toml")
    assert info.value.source == str(tmp_path / "child.toml")
    assert info.value.problems == [f"extends = 'missing.toml': no such recipe file {str(tmp_path / 'missing.toml')!r}"]
    with pytest.raises(RecipeError, match=r"is a directory, not a recipe file"):
        load_recipe(tmp_path)


def test_descriptions_with_any_characters_survive_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(
        'extends = "gpt2-tiny"\ndescription = """two\nlines, "quotes", \\\\ and \u00e9\ttab"""\n'
    )
    recipe = load_recipe(tmp_path / "r.toml")
    gptzoo.save_checkpoint(gptzoo.build_model(recipe), recipe, tmp_path / "ck")
    assert gptzoo.load_checkpoint(tmp_path / "ck").recipe.description == 'two\nlines, "quotes", \\ and \u00e9\ttab'

"""Recipes: shipped ones build with the official sizes; bad ones report every problem at once."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import torch
from fakedist import FakeSite

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.model.gpt import BLOCKS
from gptzoo.model.summary import parameter_counts
from gptzoo.recipe import load_recipe, read_recipe_data, resolve_recipe_path, shipped_recipes, validate
from gptzoo.recipe.schema import NORM_PLACEMENTS

SHIPPED = sorted(shipped_recipes())

# Hugging Face's parameter counts of GPT2LMHeadModel (tied head counted once).
GPT2_PARAMS = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}

NORMS = ", ".join(gptzoo.get_registry().names("norm"))
"""Every registered norm, as an unknown-name message lists them (plugins included)."""


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
        "unknown section or key 'tokeniser'; did you mean 'tokenizer'?"
        " (available: model, tokenizer, weights, generate, train, provenance, extends, description)",
        "[model] unknown key 'n_layers'; did you mean 'n_layer'? (available: vocab_size, context_length, n_layer,"
        " n_head, n_embd, d_ff, bias, tie_embeddings, norm, activation, mlp, position, attention, norm_placement,"
        " n_kv_head, head_dim, init_std, scale_embeddings, logit_softcap, embedding_multiplier, and 4 more)",
        "[model] bias must be true or false, got 'yes' (str)",
        f"[model] norm: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? (available: {NORMS})",
        "[model] position.theta must be a number, got 'big' (str)",
        "[model] attention.dropout: attention 'causal' has no parameter 'dropout' (available: window, softcap, scale,"
        " qk_norm, qkv_bias, sinks, output_gate)",
        "[model] norm_placement='middle' must be one of 'pre', 'post', 'sandwich', 'reordered', 'parallel'",
        "[model] n_embd=100 is not divisible by n_head=12 (or set head_dim explicitly)",
    ]


def test_component_parameter_problems(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        'extends = "llama-tiny"\n[model]\nattention = { name = "causal", dropout = 0.1 }\n'
        'position = { name = "rope", theta = "big" }\n',
    )
    assert problems == [
        "[model] position.theta must be a number, got 'big' (str)",
        "[model] attention.dropout: attention 'causal' has no parameter 'dropout' (available: window, softcap, scale,"
        " qk_norm, qkv_bias, sinks, output_gate)",
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
        "[model] n_layer=0 must be between 1 and 4096",
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
    with pytest.raises(
        RecipeError, match=r"unknown recipe 'gpt2-smal'; did you mean 'gpt2-small' or 'gpt2-small-postln'\?"
    ):
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
        load_recipe("gpt2-tiny", ["model.norm.eps=-1e-5", "model.position=sinusoidal", "model.position.base=0.5"])
    assert info.value.problems == [
        "--set model.norm.eps=-1e-5: [model] norm (layernorm): eps must be a positive number, got -1e-05",
        "--set model.position.base=0.5: [model] position (sinusoidal): base must be a number > 1, got 0.5",
    ]
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
    text = (
        'two\nlines, "quotes", \\ and \u00e9\ttab, NUL \x00 DEL \x7f RTL \u200f\u202e BOM \ufeff LS \u2028 \U0001f600'
    )
    escaped = "".join(f"\\U{ord(c):08x}" for c in text)
    (tmp_path / "r.toml").write_text(f'extends = "gpt2-tiny"\ndescription = "{escaped}"\n')
    recipe = load_recipe(tmp_path / "r.toml")
    assert recipe.description == text
    gptzoo.save_checkpoint(gptzoo.build_model(recipe), recipe, tmp_path / "ck")
    written = (tmp_path / "ck" / "recipe.toml").read_text(encoding="utf-8").splitlines()[0]
    assert written == (
        'description = "two\\nlines, \\"quotes\\", \\\\ and \u00e9\\ttab, NUL \\u0000 DEL \\u007f'
        ' RTL \\u200f\\u202e BOM \\ufeff LS \\u2028 \U0001f600"'
    )
    assert gptzoo.load_checkpoint(tmp_path / "ck").recipe.description == text


def _override_problems(*overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe("gpt2-tiny", list(overrides))
    return info.value.problems


def test_text_that_is_not_unicode_is_refused_with_its_key_path() -> None:
    """A lone surrogate (e.g. from a command line that was not UTF-8) could never be written to a
    checkpoint's recipe.toml and read back: refused wherever it is, key or value."""
    lone = "is not valid Unicode text (a lone surrogate '\\{}' at index {}); write it as UTF-8"
    cases = {
        "model.norm=x\udcffy": "[model] norm: 'x\\udcffy' " + lone.format("udcff", 1),
        'model.norm={ name = "\ud800" }': "[model] norm.name: '\\ud800' " + lone.format("ud800", 0),
        "model.n\udcffx=1": "[model] key 'n\\udcffx' " + lone.format("udcff", 1),
        "model.norm.e\ud800=1": "[model] norm: key 'e\\ud800' " + lone.format("ud800", 1),
        'generate.samplers=["top_k", "t\udcff"]': "[generate] samplers[1]: 't\\udcff' " + lone.format("udcff", 1),
        "\udcff.x=1": "key '\\udcff' " + lone.format("udcff", 0),
    }
    for override, problem in cases.items():
        assert _override_problems(override) == [problem], override[:40]
    data = read_recipe_data(resolve_recipe_path("gpt2-tiny")) | {"description": "caf\udce9", 1: 2}
    with pytest.raises(RecipeError) as info:
        validate(data, "api", name="api")
    assert info.value.problems == [
        "key 1 must be a string",
        "description: 'caf\\udce9' " + lone.format("udce9", 3),
    ]


def test_numbers_out_of_range_are_refused_with_a_range() -> None:
    """Integers beyond int64 and non-finite floats, wherever a number goes (no OverflowError)."""
    big = str(10**400)
    cases = {
        f"model.vocab_size={big}": "[model] vocab_size=~1e400 must be between 1 and 2147483647",
        f"model.init_std={big}": "[model] init_std=~1e400 must be a finite number",
        "model.init_std=1e400": "[model] init_std=inf must be a number > 0 and at most 1000",
        f"train.lr={big}": "[train] lr=~1e400 must be a finite number",
        "train.lr=-inf": "[train] lr=-inf must be a finite number >= 0",
        "train.beta1=nan": "[train] beta1=nan must be in [0, 1)",
        f"train.seed={2**64}": "[train] seed=18446744073709551616 must be at most 9223372036854775807",
        "train.max_steps=-5": "[train] max_steps=-5 must be at least 1",
        f"generate.max_new_tokens={2**63}": "[generate] max_new_tokens must be an integer between 1 and 2147483647,"
        " got 9223372036854775808 (int)",
        f'generate.samplers=[{{ name = "top_k", k = {10**30} }}]': "[generate] samplers[0].k must be an integer"
        " within int64, got 1000000000000000000000000000000",
        'generate.samplers=[{ name = "temperature", temperature = inf }]': "[generate] samplers[0].temperature"
        " must be a finite number, got inf",
        "model.norm.eps=nan": "[model] norm.eps must be a finite number, got nan",
        "model.norm.eps=-inf": "[model] norm.eps must be a finite number, got -inf",
        f"model.norm.eps={big}": "[model] norm.eps must be a finite number, got ~1e400",
        "model.norm.eps=1979-05-27": "[model] norm.eps must be a number, got datetime.date(1979, 5, 27) (date)",
        f"model.n_layer={'9' * 5000}": f"--set 'model.n_layer={'9' * 45}... (5016 characters): cannot read the value:"
        f" an integer of more than {sys.get_int_max_str_digits()} digits",
        f"model.n_layer={'[' * 3000}": f"--set 'model.n_layer={'[' * 45}... (3016 characters): cannot read the value:"
        " arrays or tables nested too deeply",
    }
    for override, problem in cases.items():
        assert _override_problems(override) == [problem], override[:40]
    # A float parameter written as an integer is a float in the recipe (and in its TOML).
    assert load_recipe("gpt2-tiny", ["model.norm.eps=1"]).model.norm.params == (("eps", 1.0),)


def test_nested_and_malformed_overrides() -> None:
    usage = "is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)"
    only_components = (
        "only a [model] component takes a parameter"
        " (model.COMPONENT.PARAM=VALUE, COMPONENT one of norm, activation, mlp, position, attention)"
    )
    assert _override_problems("a.b.c.d=1", "=", "model.=1", "train.x.y=1", "model.n_layer.x=1") == [
        f"--set 'a.b.c.d=1' {usage}",
        f"--set '=' {usage}",
        f"--set 'model.=1' {usage}",
        f"--set 'train.x.y=1': {only_components}",
        f"--set 'model.n_layer.x=1': {only_components}",
    ]
    assert _override_problems("extends.x=1", "description.x=1") == [
        "--set 'extends.x=1': 'extends' is not a section",
        "--set 'description.x=1': 'description' is not a section",
    ]
    assert _override_problems('model.norm={ name = "x" }') == [f"[model] norm: unknown norm 'x' (available: {NORMS})"]
    # One TOML value per --set: what follows a newline does not set other keys.
    assert _override_problems("model.n_layer=6\n[train]\nlr = 1") == [
        "[model] n_layer must be an integer, got '6\\n[train]\\nlr = 1' (str)"
    ]


def test_tokenizer_and_weights_are_checked() -> None:
    assert _override_problems("tokenizer.name=gtp2") == [
        "[tokenizer] name: unknown tokenizer 'gtp2'; did you mean 'gpt2'? (available: gpt2, hf, bytes)"
    ]
    assert _override_problems("weights.hf=", 'train.data="a\\u0000b"') == [
        "--set train.data=\"a\\u0000b\": [train] data must be a directory path, without NUL, got 'a\\x00b'",
        "--set weights.hf=: [weights] hf must not be empty, got ''",
    ]
    assert load_recipe("gpt2-tiny", ["tokenizer.name=bytes"]).tokenizer.name == "bytes"


def test_recipe_data_that_is_not_a_recipe() -> None:
    with pytest.raises(RecipeError) as info:
        validate([1], "api", name="api")  # type: ignore[arg-type]
    assert info.value.problems == ["a recipe must be a table of sections, got [1] (list)"]
    data = read_recipe_data(resolve_recipe_path("gpt2-tiny"))
    with pytest.raises(RecipeError) as info:
        validate(data | {"extends": "gpt2-small"}, "api", name="api")
    assert info.value.problems == ["extends = 'gpt2-small' is followed when a recipe file is read, not here"]
    deep: dict = {}
    data["model"]["norm"] = {"name": "layernorm", "eps": deep}
    for _ in range(40):
        deep["a"] = deep = {}
    with pytest.raises(RecipeError) as info:
        validate(data, "api", name="api")
    assert info.value.problems == [f"[model] norm.eps{'.a' * 30}: nested more than 32 tables or arrays deep"]


def test_unreadable_toml(tmp_path: Path) -> None:
    for text, problem in [
        ("v = " + "[" * 3000 + "]" * 3000, "invalid TOML: arrays or tables nested too deeply"),
        ("v = " + "1" * 5000, f"invalid TOML: an integer of more than {sys.get_int_max_str_digits()} digits"),
        (
            'description = "\\ud800"',
            "invalid TOML: Escaped character is not a Unicode scalar value (at line 1, column 22)",
        ),
    ]:
        (tmp_path / "r.toml").write_text(text)
        with pytest.raises(RecipeError) as info:
            load_recipe(tmp_path / "r.toml")
        assert info.value.problems == [problem]


def test_extends_edge_cases(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "latin1.toml").write_bytes(b'description = "caf\xe9"\n')
    (tmp_path / "loop-link.toml").symlink_to("loop-link.toml")
    (tmp_path / "self-link.toml").symlink_to("self.toml")
    cases = {
        '"dir"': f"extends = 'dir': '{tmp_path / 'dir'}' is a directory, not a recipe file",
        '"/dev/null"': "extends = '/dev/null': '/dev/null' is not a regular file",
        '"loop-link.toml"': f"extends = 'loop-link.toml': '{tmp_path / 'loop-link.toml'}'"
        " is a symbolic link to nothing (broken, or a loop)",
        '"self-link.toml"': "extends cycle: self.toml -> self.toml",
        '["gpt2-tiny"]': "extends must be a recipe name or path (a non-empty string), got ['gpt2-tiny'] (list)",
        "1": "extends must be a recipe name or path (a non-empty string), got 1 (int)",
        '""': "extends must be a recipe name or path (a non-empty string), got '' (str)",
    }
    for value, problem in cases.items():
        (tmp_path / "self.toml").write_text(f"extends = {value}\n")
        with pytest.raises(RecipeError) as info:
            load_recipe(tmp_path / "self.toml")
        assert (info.value.source, info.value.problems) == (str(tmp_path / "self.toml"), [problem]), value
    (tmp_path / "self.toml").write_text('extends = "latin1.toml"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "self.toml")
    assert info.value.source == str(tmp_path / "latin1.toml")
    assert info.value.problems == [
        "invalid TOML: 'utf-8' codec can't decode byte 0xe9 in position 18: invalid continuation byte; save it as UTF-8"
    ]


def test_a_long_extends_chain(tmp_path: Path) -> None:
    parent = "gpt2-tiny"
    for i in range(150):
        (tmp_path / f"r{i}.toml").write_text(f'extends = "{parent}"\n[model]\nn_layer = {i % 3 + 1}\n')
        parent = f"r{i}.toml"
    r = load_recipe(tmp_path / "r149.toml")
    assert (r.model.n_layer, r.model.n_embd, r.weights) == (149 % 3 + 1, 64, None)


def test_a_billion_layers_is_refused_before_building(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_run import run_error

    assert run_error(capsys, "build", "llama-tiny", "--set", "model.n_layer=1000000000") == (
        "error: --set model.n_layer=1000000000: [model] n_layer=1000000000 must be between 1 and 4096"
    )
    assert gptzoo.load_recipe("llama-tiny", ["model.n_layer=4096"]).model.n_layer == 4096


def test_an_unknown_key_given_with_set_is_blamed_on_the_set_argument(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_run import run_error

    message = run_error(capsys, "build", "gpt2-small", "--set", "train.eval_interval=5")
    assert message.startswith(
        "error: --set train.eval_interval=5: [train] unknown key 'eval_interval'; did you mean 'eval_every'?"
    )
    assert "gpt2-small.toml" not in message
    message = run_error(capsys, "train", "gpt2-small", "--set", "model.n_layerz=2", "--set", "train.eval_interval=5")
    assert message.startswith("error: --set model.n_layerz=2, --set train.eval_interval=5: 2 problems - --set model.")


def test_dimensions_whose_product_no_tensor_could_hold_are_refused() -> None:
    assert _override_problems("model.vocab_size=2147483647", "model.n_embd=1048576", "model.n_head=1") == [
        "[model] vocab_size x n_embd = 2147483647 x 1048576 = 2.25e+15 elements in one tensor, more than the 2**40 "
        "gptzoo builds; make them smaller"
    ]
    assert _override_problems("model.n_embd=2147483647", "model.n_head=1", "model.d_ff=1") == [
        "[model] vocab_size x n_embd = 50257 x 2147483647 = 1.08e+14 elements in one tensor, more than the 2**40 "
        "gptzoo builds; make them smaller",
        "--set model.n_embd=2147483647: [model] n_embd x n_head x head_dim = 2147483647 x 1 x 2147483647 = 4.61e+18 "
        "elements in one tensor, more than the 2**40 gptzoo builds; make them smaller",
    ]
    assert _override_problems("model.n_head=2147483647", "model.head_dim=1") == [
        "[model] n_head=2147483647 must be between 1 and 65536"
    ]
    assert _override_problems("model.init_std=1e308") == [
        "[model] init_std=1e+308 must be a number > 0 and at most 1000"
    ]


def test_a_directory_named_like_a_shipped_recipe_does_not_hide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2-tiny").mkdir()  # e.g. `gptzoo build gpt2-tiny --out gpt2-tiny`
    assert resolve_recipe_path("gpt2-tiny") == shipped_recipes()["gpt2-tiny"]
    (tmp_path / "mine.toml").write_text('extends = "gpt2-tiny"\n', encoding="utf-8")
    assert load_recipe("mine.toml").model.n_layer == load_recipe("gpt2-tiny").model.n_layer
    with pytest.raises(RecipeError) as info:
        load_recipe("")
    assert str(info.value) == "'': give a recipe: a shipped name (see `gptzoo recipes`) or a .toml file"


def test_a_byte_order_mark_is_not_content(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_text('extends = "gpt2-tiny"\n[model]\nn_layer = 1\n', encoding="utf-8-sig")
    assert load_recipe(path).model.n_layer == 1


def test_train_data_is_relative_to_the_file_that_sets_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "base.toml").write_text('extends = "gpt2-tiny"\n[train]\ndata = "data"\n', encoding="utf-8")
    (tmp_path / "child.toml").write_text('extends = "proj/base.toml"\n', encoding="utf-8")
    assert load_recipe(tmp_path / "child.toml").train.data == str(tmp_path / "proj" / "data")
    written = tmp_path / "written.toml"  # a resolved recipe, as build --out and train write it, keeps the place
    written.write_text(load_recipe(tmp_path / "child.toml").to_toml(), encoding="utf-8")
    assert load_recipe(written).train.data == str(tmp_path / "proj" / "data")
    monkeypatch.chdir(tmp_path)
    from gptzoo.training.trainer import data_dir_of

    assert data_dir_of(load_recipe("gpt2-tiny", ["train.data=here"]), None) == tmp_path / "here"  # --set: from here


def test_a_parameter_the_model_passes_points_at_its_model_key() -> None:
    assert _override_problems("model.attention.n_kv_head=2") == [
        "[model] attention.n_kv_head: attention 'causal' has no parameter 'n_kv_head'; the model passes it: "
        "set [model] n_kv_head"
    ]
    assert _override_problems("model.mlp.d_model=2") == [
        "[model] mlp.d_model: mlp 'dense' has no parameter 'd_model'; the model passes it: set [model] n_embd"
    ]


QUOTE_HINT = "; write a name that reads as a number or boolean in quotes: "


@pytest.mark.parametrize(
    ("override", "got", "quoted"),
    [
        ("model.norm=inf", "inf (float)", "inf"),
        ("model.norm=true", "True (bool)", "true"),
        ("model.norm=1e5", "100000.0 (float)", "100000.0"),
        ("model.mlp=7", "7 (int)", "7"),
    ],
)
def test_a_component_name_read_as_a_number_or_boolean_says_to_quote_it(override: str, got: str, quoted: str) -> None:
    key = override.split("=")[0]
    assert _override_problems(override) == [
        f'[model] {key.removeprefix("model.")} must be a component name or a table {{ name = "...", ... }}, got '
        f"{got}{QUOTE_HINT}{key}='\"{quoted}\"'"
    ]


def test_a_number_no_component_could_be_named_gets_no_quoting_hint() -> None:
    assert _override_problems("model.norm=-inf") == [
        '[model] norm must be a component name or a table { name = "...", ... }, got -inf (float)'
    ]


def test_a_sampler_name_read_as_a_number_or_boolean_says_to_quote_it() -> None:
    assert _override_problems("generate.samplers=[false, [1]]") == [
        '[generate] samplers[0] must be a component name or a table { name = "...", ... }, got False (bool)'
        f'{QUOTE_HINT}"false"',
        '[generate] samplers[1] must be a component name or a table { name = "...", ... }, got [1] (list)',
    ]


def test_a_component_whose_name_reads_as_a_number_is_chosen_in_quotes(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("numbers", "gptzoo_fake_numbers", NUMBER_NAMES)
    registry = gptzoo.get_registry()
    for name in ("inf", "true", "1e5"):
        assert load_recipe("gpt2-tiny", [f'model.norm="{name}"'], registry=registry).model.norm.name == name


NUMBER_NAMES = """
from gptzoo_plugins._norms import LayerNorm


@gptzoo.hookimpl
def register_norms(register):
    for name in ("inf", "true", "1e5"):
        register(name, LayerNorm)
"""


@pytest.mark.parametrize(
    "command",
    [
        ("build", "gpt2-small"),
        ("train", "gpt2-small"),
        ("generate", "gpt2-small", "--prompt", "hi"),
        ("eval", "gpt2-small", "--text", "README.md"),
        ("compare", "gpt2-small", "--hf", "gpt2"),
    ],
)
def test_every_command_that_takes_set_blames_a_bad_key_on_the_set_argument(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    from cli_run import run_error

    message = run_error(capsys, *command, "--set", "train.eval_interval=5")
    assert message == (
        "error: --set train.eval_interval=5: [train] unknown key 'eval_interval'; did you mean 'eval_every'? "
        "(available: max_steps, micro_batch_size, grad_accum, seq_len, lr, min_lr, warmup_steps, beta1, beta2, eps, "
        "weight_decay, grad_clip, precision, compile, eval_every, eval_batches, checkpoint_every, keep_checkpoints, "
        "log_every, seed, and 5 more)"
    )


NO_INIT = """
import torch
from torch import nn

import gptzoo


class Cube(nn.Module):
    def forward(self, x):
        return x**3


@gptzoo.hookimpl
def register_activations(register):
    register("cube", Cube)
"""
"""An activation written as plugin authors often write one: an nn.Module without an __init__ of its own."""


def test_a_module_without_its_own_init_takes_no_parameters(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's Module.__init__ reads (*args, **kwargs) but refuses every keyword: the recipe refuses one."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("cube", "gptzoo_fake_cube", NO_INIT)
    registry = gptzoo.get_registry()
    assert load_recipe("gpt2-tiny", ["model.activation=cube"], registry=registry).model.activation.name == "cube"
    with pytest.raises(RecipeError) as excinfo:
        load_recipe("gpt2-tiny", ["model.activation=cube", "model.activation.power=2"], registry=registry)
    assert excinfo.value.problems == [
        "[model] activation.power: activation 'cube' has no parameter 'power' (it takes none)"
    ]

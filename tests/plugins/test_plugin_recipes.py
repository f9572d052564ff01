"""A plugin ships recipes and sweep specs by name (register_recipes): `gptzoo recipes` lists them with
their distribution, `gptzoo build NAME` and `gptzoo sweep NAME` find them, a shipped name stays the
shipped recipe's with one warning, and a path that is no file fails the plugin at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_json
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main
from gptzoo.sweep.spec import find_spec

RECIPES = """
from pathlib import Path

import gptzoo

HERE = Path(__file__).parent / "gptzoo_fake_zoo_recipes"


@gptzoo.hookimpl
def register_recipes(register):
    register("tiny-wide", HERE / "tiny-wide.toml")
    register("gpt2-small", HERE / "gpt2-small.toml")
    register("tiny-sweep", HERE / "tiny-sweep.toml", sweep=True)
"""
TINY_WIDE = 'extends = "gpt2-tiny"\ndescription = "gpt2-tiny, twice as wide"\n[model]\nn_embd = 128\n'


@pytest.fixture
def zoo(fake_site: FakeSite) -> FakeSite:
    folder = fake_site.root / "gptzoo_fake_zoo_recipes"
    folder.mkdir()
    (folder / "tiny-wide.toml").write_text(TINY_WIDE, encoding="utf-8")
    (folder / "gpt2-small.toml").write_text('extends = "gpt2-tiny"\n', encoding="utf-8")
    (folder / "tiny-sweep.toml").write_text('base = "gpt2-tiny"\n[[variants]]\nname = "a"\n', encoding="utf-8")
    fake_site.add("zoo", "gptzoo_fake_zoo", RECIPES)
    return fake_site


def test_recipes_lists_a_plugins_recipes_with_their_distribution(
    zoo: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {r["name"]: r for r in run_json(capsys, "recipes")}
    assert rows["tiny-wide"]["distribution"] == "gptzoo-fake-zoo"
    assert rows["tiny-wide"]["description"] == "gpt2-tiny, twice as wide"
    assert rows["gptzoo-fake-zoo:gpt2-small"]["distribution"] == "gptzoo-fake-zoo"  # the bare name is shipped
    assert rows["gpt2-small"]["distribution"] == "gptzoo"
    assert "tiny-sweep" not in rows


def test_build_finds_a_plugins_recipe_by_name(zoo: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, "build", "tiny-wide")["shape"]["n_embd"] == 128
    assert run_json(capsys, "build", "gptzoo-fake-zoo:tiny-wide")["shape"]["n_embd"] == 128


def test_a_shipped_name_stays_the_shipped_recipes_with_a_warning(
    zoo: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", "gpt2-small", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["shape"]["n_embd"] == 768  # the shipped gpt2-small, not the plugin's
    assert captured.err == (
        "warning: recipe 'gpt2-small' is the shipped one; gptzoo_fake_zoo (gptzoo-fake-zoo 1.0) registers one of "
        "that name too: name it 'gptzoo-fake-zoo:gpt2-small'\n"
    )
    assert run_json(capsys, "build", "gptzoo-fake-zoo:gpt2-small")["shape"]["n_embd"] == 64


def test_a_sweep_spec_is_found_by_name(zoo: FakeSite) -> None:
    assert (
        find_spec("tiny-sweep", gptzoo.get_registry())
        == (zoo.root / "gptzoo_fake_zoo_recipes" / "tiny-sweep.toml").resolve()
    )


def test_a_recipe_path_that_is_no_file_fails_the_plugin(fake_site: FakeSite, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    fake_site.add("gone", "gptzoo_fake_gone", RECIPES.replace('HERE / "tiny-wide.toml"', repr(str(missing))))
    (info,) = [p for p in gptzoo.get_registry().plugins if p.name == "gone"]
    assert info.status == "failed"
    assert info.error == (
        f"gptzoo_fake_gone (gptzoo-fake-gone 1.0) registered a recipe 'tiny-wide' at {str(missing)!r}, which is not "
        "a file; pass the path of its TOML file (e.g. Path(__file__).parent / 'recipes' / 'NAME.toml', shipped as "
        "package data)"
    )


def test_a_plugins_recipe_keeps_its_bare_names_when_a_built_in_takes_them(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plugin registered norm 'rmsnorm' before gptzoo had one (a built-in took the name later, as 'moe'
    and 'mla' were): the recipe it ships, which says `norm = "rmsnorm"`, still means the plugin's norm,
    silently, and so does a user's recipe that extends it; the recipe it extends (llama-tiny's own bare
    'rmsnorm') and a user's file that names 'rmsnorm' bare mean the built-in, with the warning (once)."""
    from fakedist import rmsnorm_replacement

    folder = fake_site.root / "gptzoo_fake_early_recipes"
    folder.mkdir()
    (folder / "early.toml").write_text('extends = "llama-tiny"\n[model]\nnorm = "rmsnorm"\n', encoding="utf-8")
    source = rmsnorm_replacement(override=False) + (
        "\n\n@gptzoo.hookimpl\ndef register_recipes(register):\n"
        "    from pathlib import Path\n\n"
        '    register("early", Path(__file__).parent / "gptzoo_fake_early_recipes" / "early.toml")\n'
    )
    fake_site.add("early", "gptzoo_fake_early", source)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("early", registry=registry)
    assert recipe.model.norm.name == "gptzoo-fake-early:rmsnorm"
    assert recipe.model.norm.origin == "gptzoo-fake-early 1.0"
    with pytest.warns(gptzoo.GptzooWarning, match="write 'gptzoo-fake-early:rmsnorm' for the plugin's"):
        assert gptzoo.load_recipe("llama-tiny", registry=registry).model.norm.origin.startswith("gptzoo ")
    user = fake_site.root / "user.toml"
    user.write_text('extends = "early"\n[model]\nn_layer = 1\n', encoding="utf-8")
    assert gptzoo.load_recipe(user, registry=registry).model.norm.name == "gptzoo-fake-early:rmsnorm"
    bare = fake_site.root / "bare.toml"
    bare.write_text('extends = "early"\n[model]\nnorm = "rmsnorm"\n', encoding="utf-8")
    assert gptzoo.load_recipe(bare, registry=registry).model.norm.origin.startswith("gptzoo ")  # warned once, above
    norm = next(c for c in run_json(capsys, "build", "early")["components"] if c["key"] == "norm")
    assert (norm["name"], norm["distribution"]) == ("rmsnorm", "gptzoo-fake-early")

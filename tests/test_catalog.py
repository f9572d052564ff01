"""Which shipped recipes use which components, read from their TOML without the validator: the same
entries validation resolves, in [model], every layer type and the sampler chain."""

from __future__ import annotations

import functools

import pytest
from cli_run import run_json
from fakedist import SCALENORM_CLASS, FakeSite

import gptzoo
from gptzoo import catalog
from gptzoo.errors import GptzooError
from gptzoo.recipe import load_recipe, read_recipe_data, resolve_components, shipped_recipes


@functools.cache
def rmsnorm_recipes() -> list[str]:
    """The shipped recipes that use the built-in rmsnorm in [model] or a layer type, as the validator
    resolves them (what `gptzoo recipes --uses rmsnorm` must list, found the other way)."""
    registry = gptzoo.get_registry(third_party=False)

    def norms(name: str) -> set[str]:
        resolved = resolve_components(load_recipe(name, registry=registry), registry).values()
        return {entry.qualified_name for entry, _ in resolved if entry.kind == "norm"}

    users = [name for name in shipped_recipes() if "gptzoo:rmsnorm" in norms(name)]
    assert {"llama-tiny", "smollm2-135m"} <= set(users) and "gpt2-small" not in users
    return users


RMSNORM_AGAIN = (
    SCALENORM_CLASS
    + """
import gptzoo


@gptzoo.hookimpl
def register_norms(register):
    register("rmsnorm", ScaleNorm)
"""
)
"""A plugin that registers a norm under the built-in's name (shadowed: the built-in keeps it)."""


@pytest.mark.parametrize("name", list(shipped_recipes()))
def test_a_shipped_recipe_uses_the_entries_validation_resolves(registry: gptzoo.Registry, name: str) -> None:
    recipe = load_recipe(name, registry=registry)
    validated = {(e.kind, e.qualified_name) for e, _ in resolve_components(recipe, registry).values()}
    validated |= {("sampler", step.entry.qualified_name) for step in recipe.generate.samplers}
    assert catalog.uses(read_recipe_data(shipped_recipes()[name]), registry) == validated


def test_a_layer_type_and_a_sampler_chain_are_read_as_validation_reads_them(registry: gptzoo.Registry) -> None:
    assert catalog.uses(read_recipe_data(shipped_recipes()["gemma3-270m"]), registry) >= {
        ("attention", "gptzoo:sliding_window"),
        ("position", "gptzoo:rope"),
    }
    data = {
        "model": {"norm": "rmsnorm", "layer_types": {"local": {"norm": {"eps": 1e-6}}}},
        "generate": {"samplers": [{"name": "top_k", "k": 5}, "greedy"]},
    }
    assert catalog.uses(data, registry) == {
        ("norm", "gptzoo:rmsnorm"),
        ("sampler", "gptzoo:top_k"),
        ("sampler", "gptzoo:greedy"),
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"norm": "nonorm"}}, "[model] norm: unknown norm 'nonorm'"),
        ({"model": {"norm": {"eps": 1e-6}}}, '[model] norm must be a component name or a table { name = "...", ... }'),
        ({"generate": {"samplers": [3]}}, "[generate] samplers[0] must be a component name"),
    ],
)
def test_a_name_that_does_not_resolve_is_the_recipes_problem(
    registry: gptzoo.Registry, data: dict, message: str
) -> None:
    with pytest.raises(GptzooError) as excinfo:
        catalog.uses(data, registry)
    assert str(excinfo.value).startswith(message)


def test_list_and_recipes_uses_name_the_recipes_of_an_entry(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("rms", "gptzoo_fake_rms", RMSNORM_AGAIN)
    rows = {r["qualified_name"]: r["recipes"] for r in run_json(capsys, "list", "norm", "rmsnorm")}
    users = rmsnorm_recipes()
    assert rows == {"gptzoo:rmsnorm": users, "gptzoo-fake-rms:rmsnorm": []}  # the built-in keeps the bare name
    assert [r["name"] for r in run_json(capsys, "recipes", "--uses", "rmsnorm")] == users
    assert [r["name"] for r in run_json(capsys, "recipes", "--uses", "gptzoo-fake-rms:rmsnorm")] == []
    both = run_json(capsys, "recipes", "--uses", "rmsnorm", "--uses", "sliding_window")
    assert [r["name"] for r in both] == ["gpt-oss-20b", "gpt-oss-tiny", "mistral-7b", "phi-3-mini"]
    assert [r["name"] for r in run_json(capsys, "recipes", "--uses", "gemma_rmsnorm", "--uses", "sliding_window")] == [
        "gemma2-2b",
        "gemma3-270m",
    ]


def test_recipes_uses_a_component_no_recipe_uses_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from gptzoo.cli import main

    assert main(["recipes", "--uses", "repetition_penalty"]) == 0
    assert capsys.readouterr().out == "no shipped recipe uses repetition_penalty\n"
    assert main(["recipes", "--uses", "rmsnorm", "--uses", "learned"]) == 0
    assert capsys.readouterr().out == "no shipped recipe uses rmsnorm and learned\n"
    assert run_json(capsys, "recipes", "--uses", "repetition_penalty") == []

"""Component names: qualified ``DIST:name``, clashes between plugins (ambiguous, shadowed, replaced),
the provenance a checkpoint records and what loading one without its plugin says, partial component
overrides in child recipes and ``--set``, and ``--set`` problems named by their override."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from cli_run import run_error, run_json
from fakedist import SCALENORM, FakeSite, rmsnorm_replacement
from test_plugins import report

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import AmbiguousComponentError
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.recipe import override_recipe

GPTZOO = f"gptzoo {gptzoo_version()}"


@pytest.fixture(autouse=True)
def _plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "GPTZOO_PLUGIN_WARN_S"):
        monkeypatch.delenv(var, raising=False)


def dyt_plugin(activation: str) -> str:
    """A plugin registering norm ``dyt`` and an activation of its own."""
    return f'''
import torch
from torch import nn


class DyT(nn.Module):
    """DyT: weight * tanh(alpha * x) (Zhu et al., 2025)."""

    def __init__(self, dim, *, alpha=0.5):
        super().__init__()
        self.alpha = alpha
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x)


class Act(nn.Module):
    """An activation of {activation}."""

    def forward(self, x):
        return torch.relu(x)


@gptzoo.hookimpl
def register_norms(register):
    register("dyt", DyT)


@gptzoo.hookimpl
def register_activations(register):
    register({activation!r}, Act)
'''


@pytest.fixture
def clash(fake_site: FakeSite) -> FakeSite:
    """gptzoo-a 1.0 and gptzoo-b 2.0 both register norm 'dyt' (neither with override=True)."""
    fake_site.add("a", "gptzoo_fake_a", dyt_plugin("act_a"), dist="gptzoo-a", version="1.0")
    fake_site.add("b", "gptzoo_fake_b", dyt_plugin("act_b"), dist="gptzoo-b", version="2.0")
    return fake_site


AMBIGUOUS = (
    "norm 'dyt' is ambiguous: gptzoo-a 1.0 and gptzoo-b 2.0 both register it; write 'gptzoo-a:dyt' or 'gptzoo-b:dyt'"
)


def test_a_name_two_plugins_register_is_ambiguous_and_each_qualified_name_works(
    clash: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = gptzoo.get_registry(strict=True)  # neither plugin failed
    assert report(registry, "a").status == report(registry, "b").status == "ok"
    with pytest.raises(AmbiguousComponentError) as excinfo:
        registry.get("norm", "dyt")
    assert str(excinfo.value) == AMBIGUOUS
    assert "dyt" not in registry.names("norm")
    assert [registry.get("norm", q).provenance.distribution for q in ("gptzoo-a:dyt", "gptzoo-b:dyt")] == [
        "gptzoo-a",
        "gptzoo-b",
    ]
    assert "gptzoo-a:dyt" in registry.available("norm") and "gptzoo-b:dyt" in registry.available("norm")
    # everything else of both plugins works
    assert registry.get("activation", "act_a").provenance.distribution == "gptzoo-a"
    assert registry.get("activation", "act_b").provenance.distribution == "gptzoo-b"
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=dyt") == (
        f"error: --set model.norm=dyt: [model] norm: {AMBIGUOUS}"
    )
    for dist, activation in (("gptzoo-a", "act_b"), ("gptzoo-b", "act_a")):
        summary = run_json(
            capsys, "build", "gpt2-tiny", "--set", f"model.norm={dist}:dyt", "--set", f"model.activation={activation}"
        )
        norm = next(c for c in summary["components"] if c["key"] == "norm")
        assert (norm["name"], norm["distribution"]) == ("dyt", dist)


def test_plugins_and_list_report_the_ambiguous_name(
    clash: FakeSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the table on one line a row
    rows = {row["name"]: row for row in run_json(capsys, "plugins")}
    assert rows["a"]["registered"] == ["norm:dyt", "activation:act_a"]
    assert rows["a"]["notes"] == ["norm 'dyt' is ambiguous: gptzoo-b 2.0 also registers it; write 'gptzoo-a:dyt'"]
    assert rows["b"]["notes"] == ["norm 'dyt' is ambiguous: gptzoo-a 1.0 also registers it; write 'gptzoo-b:dyt'"]
    listed = run_json(capsys, "list", "norm", "dyt")
    assert [(r["qualified_name"], r["note"]) for r in listed] == [
        ("gptzoo-a:dyt", "ambiguous: gptzoo-b 2.0 also registers it; write 'gptzoo-a:dyt'"),
        ("gptzoo-b:dyt", "ambiguous: gptzoo-a 1.0 also registers it; write 'gptzoo-b:dyt'"),
    ]
    assert [r["qualified_name"] for r in run_json(capsys, "list", "norm", "GPTZOO_B:dyt")] == ["gptzoo-b:dyt"]
    assert [r["note"] for r in run_json(capsys, "list", "norm", "gptzoo:layernorm")] == [None]
    assert run_error(capsys, "list", "norm", "gptzoo-c:dyt").startswith("error: unknown norm 'gptzoo-c:dyt'")
    assert main(["plugins"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "norm 'dyt' is ambiguous: gptzoo-b 2.0 also registers it; write 'gptzoo-a:dyt'" in table


def test_an_override_over_an_ambiguous_name_takes_it(clash: FakeSite) -> None:
    clash.add(
        "c",
        "gptzoo_fake_c",
        "from gptzoo_fake_a import DyT\n\n\n@gptzoo.hookimpl\ndef register_norms(register):\n"
        "    register('dyt', DyT, override=True)\n",
        dist="gptzoo-c",
    )
    registry = gptzoo.get_registry(strict=True)
    assert registry.get("norm", "dyt").qualified_name == "gptzoo-c:dyt"
    replaced = registry.get("norm", "gptzoo-a:dyt")
    assert registry.note(replaced) == ("replaced by gptzoo_fake_c (gptzoo-c 1.0) (override=True); write 'gptzoo-a:dyt'")


def test_a_builtin_is_reachable_by_its_qualified_name(registry: gptzoo.Registry) -> None:
    for entry in registry.entries():
        assert registry.get(entry.kind, entry.qualified_name) is entry
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.norm=gptzoo:layernorm"], registry=registry)
    assert recipe.model.norm.name == "gptzoo:layernorm"
    assert gptzoo.build_model(recipe, device="meta", registry=registry).blocks[0].ln_1.__class__.__name__ == "LayerNorm"
    chain = gptzoo.load_recipe(
        "gpt2-tiny", ['generate.samplers=[{ name = "gptzoo:top_k", k = 5 }]'], registry=registry
    ).generate.samplers
    assert [(c.name, c.kwargs) for c in chain] == [("gptzoo:top_k", {"k": 5})]


def test_a_qualified_name_of_no_such_distribution_lists_what_is_available(registry: gptzoo.Registry) -> None:
    with pytest.raises(gptzoo.UnknownComponentError) as excinfo:
        registry.get("norm", "gptzoo-nope:layernorm")
    qualified = [e.qualified_name for e in registry.all_entries("norm")]
    assert str(excinfo.value) == (
        f"unknown norm 'gptzoo-nope:layernorm'; did you mean 'gptzoo:layernorm'? (available: {', '.join(qualified)})"
    )


# --- provenance in checkpoints --------------------------------------------------------------------------------


@pytest.fixture
def plugin_checkpoint(fake_site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A checkpoint of gpt2-tiny with norm 'scalenorm' of gptzoo-fake-good 1.0."""
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    ck = tmp_path / "ck"
    assert (
        main(["build", "gpt2-tiny", "--set", "model.norm=scalenorm", "--set", "model.n_layer=1", "--out", str(ck)]) == 0
    )
    assert capsys.readouterr().err == ""
    return ck


def test_a_checkpoint_records_where_each_component_came_from(plugin_checkpoint: Path) -> None:
    written = tomllib.loads((plugin_checkpoint / "recipe.toml").read_text(encoding="utf-8"))
    assert written["provenance"] == {
        "norm": "gptzoo-fake-good 1.0",
        "activation": GPTZOO,
        "mlp": GPTZOO,
        "position": GPTZOO,
        "attention": GPTZOO,
        **({"samplers": [GPTZOO] * len(written["generate"]["samplers"])} if "generate" in written else {}),
    }
    model = gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    assert model.recipe.model.norm.origin == "gptzoo-fake-good 1.0"


def test_a_checkpoint_component_may_be_named_qualified(plugin_checkpoint: Path) -> None:
    """The same entry by another name is no change of structure."""
    model = gptzoo.load_checkpoint(
        plugin_checkpoint, overrides=["model.norm=gptzoo-fake-good:scalenorm"], registry=gptzoo.get_registry()
    )
    assert model.recipe.model.norm.name == "gptzoo-fake-good:scalenorm"
    activation = model.recipe.model.activation.name
    assert activation != "relu"
    renamed = gptzoo.load_checkpoint(
        plugin_checkpoint, overrides=[f"model.activation=gptzoo:{activation}"], registry=gptzoo.get_registry()
    )
    assert renamed.recipe.model.activation.name == f"gptzoo:{activation}"
    with pytest.raises(gptzoo.CheckpointError, match=f"model.activation would change from '{activation}' to 'relu'"):
        gptzoo.load_checkpoint(plugin_checkpoint, overrides=["model.activation=relu"], registry=gptzoo.get_registry())


def test_a_checkpoint_whose_plugin_is_uninstalled_names_the_distribution(
    plugin_checkpoint: Path, fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(fake_site.root / "gptzoo_fake_good-1.0.dist-info")
    recipe = plugin_checkpoint / "recipe.toml"
    message = (
        f"{recipe}: [model] norm: norm 'scalenorm' came from gptzoo-fake-good 1.0, which is not installed: pip install "
        "gptzoo-fake-good"
    )
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    assert str(excinfo.value) == message
    assert run_error(capsys, "generate", "--checkpoint", str(plugin_checkpoint), "--prompt", "a") == f"error: {message}"
    # a checkpoint written before [provenance] existed says what any unknown name says
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text[: text.index("[provenance]")], encoding="utf-8")
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    assert str(excinfo.value).startswith(f"{recipe}: [model] norm: unknown norm 'scalenorm'")


def test_a_checkpoint_whose_plugin_fails_to_load_says_why(
    plugin_checkpoint: Path, fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.forget_modules()
    (fake_site.root / "gptzoo_fake_good.py").write_text("raise ImportError('needs libfrob')\n", encoding="utf-8")
    message = (
        f"{plugin_checkpoint / 'recipe.toml'}: [model] norm: norm 'scalenorm' came from gptzoo-fake-good 1.0, which "
        "is installed but failed to load: ImportError: needs libfrob; fix or reinstall it (see `gptzoo plugins`)"
    )
    assert run_error(capsys, "generate", "--checkpoint", str(plugin_checkpoint), "--prompt", "a").endswith(message)


def test_a_checkpoint_without_provenance_still_loads(plugin_checkpoint: Path) -> None:
    recipe = plugin_checkpoint / "recipe.toml"
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text[: text.index("[provenance]")], encoding="utf-8")
    model = gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    assert model.recipe.model.norm.name == "scalenorm"


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("norm = 42", 'norm must be "DISTRIBUTION VERSION" (e.g. "gptzoo 0.1.0"), got 42 (int)'),
        ('norm = "gptzoo"', 'norm must be "DISTRIBUTION VERSION" (e.g. "gptzoo 0.1.0"), got \'gptzoo\' (str)'),
        (
            'norm = "a b; rm -rf /"',
            'norm must be "DISTRIBUTION VERSION" (e.g. "gptzoo 0.1.0"), got \'a b; rm -rf /\' (str)',
        ),
        ("samplers = [1]", 'samplers must be a list of "DISTRIBUTION VERSION" (e.g. "gptzoo 0.1.0"), got [1] (list)'),
        (
            'normm = "gptzoo 0.1.0"',
            "unknown key 'normm'; did you mean 'norm'? (available: norm, activation, mlp, "
            "position, attention, samplers, layer_types)",
        ),
    ],
)
def test_a_malformed_provenance_is_refused(plugin_checkpoint: Path, table: str, problem: str) -> None:
    recipe = plugin_checkpoint / "recipe.toml"
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text[: text.index("[provenance]")] + f"[provenance]\n{table}\n", encoding="utf-8")
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    assert str(excinfo.value) == f"{recipe}: [provenance] {problem}"


def test_renaming_a_component_forgets_its_recorded_origin(plugin_checkpoint: Path, fake_site: FakeSite) -> None:
    model = gptzoo.load_checkpoint(plugin_checkpoint, registry=gptzoo.get_registry())
    renamed = override_recipe(model.recipe, ["model.attention=eager"], registry=gptzoo.get_registry())
    assert renamed.model.attention.origin == GPTZOO
    shutil.rmtree(fake_site.root / "gptzoo_fake_good-1.0.dist-info")
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        override_recipe(model.recipe, ["model.norm=nonorm"], registry=gptzoo.get_registry())
    assert str(excinfo.value).startswith("--set model.norm=nonorm: [model] norm: unknown norm 'nonorm'")


def test_a_checkpoint_of_a_name_that_became_ambiguous_loads_the_recorded_one(
    fake_site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("a", "gptzoo_fake_a", dyt_plugin("act_a"), dist="gptzoo-a", version="1.0")
    ck = tmp_path / "ck"
    assert main(["build", "gpt2-tiny", "--set", "model.norm=dyt", "--set", "model.n_layer=1", "--out", str(ck)]) == 0
    capsys.readouterr()
    fake_site.add("b", "gptzoo_fake_b", dyt_plugin("act_b"), dist="gptzoo-b", version="2.0")
    model = gptzoo.load_checkpoint(ck, registry=gptzoo.get_registry())
    assert model.recipe.model.norm.name == "gptzoo-a:dyt"
    assert type(model.blocks[0].ln_1).__module__ == "gptzoo_fake_a"
    recipe = ck / "recipe.toml"
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text[: text.index("[provenance]")], encoding="utf-8")  # no record: ambiguous
    assert run_error(capsys, "generate", "--checkpoint", str(ck), "--prompt", "a") == (
        f"error: {recipe}: [model] norm: {AMBIGUOUS}"
    )


# --- child recipes and --set change one parameter -------------------------------------------------------------


def test_a_child_recipe_changes_one_parameter_of_its_parents_component(tmp_path: Path) -> None:
    parent = gptzoo.load_recipe("llama-tiny")
    assert parent.model.position.name == "rope"
    child = tmp_path / "child.toml"
    child.write_text('extends = "llama-tiny"\n\n[model]\nposition = { theta = 5e5 }\n', encoding="utf-8")
    position = gptzoo.load_recipe(child).model.position
    assert (position.name, position.kwargs) == ("rope", {**parent.model.position.kwargs, "theta": 5e5})
    for override in ("model.position.theta=5e5", "model.position={ theta = 5e5 }"):
        position = gptzoo.load_recipe("llama-tiny", [override]).model.position
        assert (position.name, position.kwargs) == ("rope", {**parent.model.position.kwargs, "theta": 5e5})
    # a table with a name still replaces the component whole
    child.write_text('extends = "llama-tiny"\n\n[model]\nposition = { name = "rope" }\n', encoding="utf-8")
    assert gptzoo.load_recipe(child).model.position.kwargs == {}


def test_a_set_problem_names_the_override_not_the_recipe_file(capsys: pytest.CaptureFixture[str]) -> None:
    available = ", ".join(gptzoo.get_registry().available("norm"))
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=nope") == (
        f"error: --set model.norm=nope: [model] norm: unknown norm 'nope' (available: {available})"
    )
    message = run_error(capsys, "build", "gpt2-tiny", "--set", "model.bias=yes", "--set", "model.n_layer=0")
    assert message == (
        "error: --set model.bias=yes, --set model.n_layer=0: 2 problems - --set model.bias=yes: [model] bias must be "
        "true or false, got 'yes' (str) - --set model.n_layer=0: [model] n_layer=0 must be between 1 and 4096"
    )
    assert "gpt2-tiny.toml" not in message


def test_json_of_a_plugin_without_hooks_carries_its_warning(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    fake_site.add("nohook", "gptzoo_fake_nohook", "def register_norms(register):\n    register('x', object)\n")
    row = next(r for r in run_json(capsys, "plugins") if r["name"] == "nohook")
    assert (row["status"], row["warning"], row["registered"]) == (
        "ok",
        "implements no gptzoo hook: did you forget @gptzoo.hookimpl?",
        [],
    )
    assert main(["plugins"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "warning: implements no gptzoo hook: did you forget @gptzoo.hookimpl?" in table
    assert json.dumps(row)  # plain JSON


def test_plugins_and_list_report_a_shadowed_name(fake_site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    fake_site.add("dup", "gptzoo_fake_dup", rmsnorm_replacement(override=False))
    note = (
        f"shadowed: 'rmsnorm' means the norm of {GPTZOO}; write 'gptzoo-fake-dup:rmsnorm' (or register it with "
        "override=True)"
    )
    row = next(r for r in run_json(capsys, "plugins") if r["name"] == "dup")
    assert (row["status"], row["registered"], row["notes"]) == ("ok", ["norm:rmsnorm"], [f"norm 'rmsnorm' is {note}"])
    listed = run_json(capsys, "list", "norm", "rmsnorm")
    assert [(r["qualified_name"], r["note"]) for r in listed] == [
        ("gptzoo:rmsnorm", None),
        ("gptzoo-fake-dup:rmsnorm", note),
    ]
    assert main(["build", "llama-tiny", "--json"]) == 0  # the shipped recipe keeps its meaning, said once
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    said = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    assert len(said) == 1 and said[0].startswith("warning: [model] norm: norm 'rmsnorm' is the built-in one "), said
    norm = next(c for c in summary["components"] if c["key"] == "norm")
    assert (norm["name"], norm["distribution"]) == ("rmsnorm", "gptzoo")

"""The plugin system: entry-point discovery, failure isolation, strict mode, provenance, the CLI.

Third-party plugins are real distributions: the example ``examples/gptzoo-sqrelu`` (installed with
``pip install -e``) and fake ones written into tmp_path (see fakedist.py). Subprocess tests (the
CLI, import side effects) are few because each one imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from fakedist import (  # tests/ is on sys.path (pyproject: pythonpath)
    BAD_SIGNATURE,
    BROKEN,
    BROKEN_MESSAGE,
    SCALENORM,
    TYPO,
    FakeSite,
    rmsnorm_replacement,
)
from torch import nn

import gptzoo
from gptzoo.plugin_manager import DEFAULT_PLUGINS, PluginInfo, gptzoo_version
from gptzoo.registry import Provenance

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = REPO / "examples" / "gptzoo-sqrelu"
INSTALL_HINT = "pip install -e examples/gptzoo-sqrelu"
GPTZOO_VERSION = gptzoo_version()
BUILTIN_NORMS = Provenance("gptzoo_plugins.norms", "gptzoo", GPTZOO_VERSION)


def run_gptzoo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gptzoo", *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )


def report(registry: gptzoo.Registry, name: str) -> PluginInfo:
    matches = [p for p in registry.plugins if p.name == name]
    assert len(matches) == 1, f"plugin {name!r} reported {len(matches)} times: {registry.plugins}"
    return matches[0]


def require_example() -> None:
    """Fail (never skip) unless this repository's example plugin is installed."""
    try:
        dist = metadata.distribution("gptzoo-sqrelu")
    except metadata.PackageNotFoundError:
        pytest.fail(f"the example plugin distribution gptzoo-sqrelu is not installed; run `{INSTALL_HINT}`")
    spec = importlib.util.find_spec("gptzoo_sqrelu")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if dist.version != "0.1.0" or origin != EXAMPLE_DIR / "gptzoo_sqrelu.py":
        pytest.fail(
            f"gptzoo-sqrelu {dist.version} is installed from {origin}, not from {EXAMPLE_DIR}; run `{INSTALL_HINT}`"
        )


@pytest.fixture(autouse=True)
def _plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests set the plugin variables themselves; none leaks in from the outer environment."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    monkeypatch.delenv("GPTZOO_STRICT_PLUGINS", raising=False)


@pytest.fixture(scope="module")
def cli_site(tmp_path_factory: pytest.TempPathFactory) -> FakeSite:
    """For subprocesses (PYTHONPATH): a good plugin (norm scalenorm) and one that raises on import."""
    site = FakeSite(tmp_path_factory.mktemp("cli") / "site")
    site.add("good", "gptzoo_fake_cli_good", SCALENORM)
    site.add("broken", "gptzoo_fake_cli_broken", BROKEN)
    return site


# --- the example distribution examples/gptzoo-sqrelu --------------------------------------------


def test_example_plugin_is_registered_with_provenance() -> None:
    require_example()
    registry = gptzoo.get_registry()
    entry = registry.get("activation", "squared_relu")
    assert entry.provenance == Provenance("gptzoo_sqrelu", "gptzoo-sqrelu", "0.1.0")
    assert str(entry.provenance) == "gptzoo_sqrelu (gptzoo-sqrelu 0.1.0)"
    assert entry.overrides is None
    assert entry.doc == "Squared ReLU: relu(x)**2 (So et al., 2021, Primer)."
    assert report(registry, "sqrelu") == PluginInfo(
        "sqrelu", "gptzoo_sqrelu", "gptzoo-sqrelu", "0.1.0", builtin=False, status="ok", error=None, contract=2
    )
    assert entry.contract == 2


def test_example_activation_computes_squared_relu_exactly() -> None:
    require_example()
    act = gptzoo.get_registry().get("activation", "squared_relu").factory()
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    assert torch.equal(act(x), torch.tensor([0.0, 0.0, 0.0, 0.25, 1.0, 9.0]))
    h = torch.randn(4, 7, dtype=torch.bfloat16)
    out = act(h)
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.relu(h) ** 2)


class _ManualSquaredReLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x * x, torch.zeros_like(x))


def test_recipe_with_example_activation_builds_and_runs() -> None:
    require_example()
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.activation=squared_relu"])
    assert recipe.model.activation.name == "squared_relu" and dict(recipe.model.activation.params) == {}
    model = gptzoo.build_model(recipe, device="cpu")
    assert [type(block.mlp.act).__name__ for block in model.blocks] == ["SquaredReLU", "SquaredReLU"]
    idx = torch.randint(0, recipe.model.vocab_size, (2, 9))
    with torch.no_grad():
        logits = model(idx)
        assert logits.shape == (2, 9, 50257)
        # The MLP is c_proj(relu(c_fc(x))**2), computed by hand...
        mlp = model.blocks[0].mlp
        x = torch.randn(2, 9, 64)
        torch.testing.assert_close(mlp(x), mlp.c_proj(_ManualSquaredReLU()(mlp.c_fc(x))), rtol=0, atol=0)
        # ...and the whole model gives the same logits with a hand-written activation in every block,
        for block in model.blocks:
            block.mlp.act = _ManualSquaredReLU()
        torch.testing.assert_close(model(idx), logits, rtol=0, atol=0)
        # but not with plain relu (so the comparison above can tell activations apart).
        for block in model.blocks:
            block.mlp.act = nn.ReLU()
        assert not torch.allclose(model(idx), logits)


# --- fake distributions in this process -----------------------------------------------------------


def test_good_plugin_norm_is_usable_from_a_recipe(fake_site: FakeSite) -> None:
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    registry = gptzoo.get_registry()
    assert report(registry, "good") == PluginInfo("good", "gptzoo_fake_good", "gptzoo-fake-good", "1.0", builtin=False)
    entry = registry.get("norm", "scalenorm")
    assert entry.provenance == Provenance("gptzoo_fake_good", "gptzoo-fake-good", "1.0")
    assert entry.doc == "ScaleNorm: g * x / max(||x||, eps), one learned scalar g (Nguyen & Salazar, 2019)."
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.norm=scalenorm", "model.norm.eps=1e-3"], registry=registry)
    model = gptzoo.build_model(recipe, device="cpu", registry=registry)
    norms = [model.blocks[0].ln_1, model.blocks[0].ln_2, model.blocks[1].ln_1, model.blocks[1].ln_2, model.ln_f]
    assert [type(n).__name__ for n in norms] == ["ScaleNorm"] * 5
    assert model.ln_f.eps == 1e-3
    x = torch.randn(3, 64)
    expected = 8.0 * x / x.norm(dim=-1, keepdim=True)  # g is initialized to sqrt(dim)
    torch.testing.assert_close(model.ln_f(x), expected)


def test_plugin_failing_on_import_is_reported_and_others_keep_working(fake_site: FakeSite) -> None:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)  # sorts (and loads) before "good"
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    registry = gptzoo.get_registry()
    assert report(registry, "broken") == PluginInfo(
        "broken",
        "gptzoo_fake_broken",
        "gptzoo-fake-broken",
        "1.0",
        builtin=False,
        status="failed",
        error=f"RuntimeError: {BROKEN_MESSAGE}",
    )
    assert [p.name for p in registry.failed] == ["broken"]
    assert report(registry, "good").status == "ok"
    assert [p.name for p in registry.plugins if p.builtin] == list(DEFAULT_PLUGINS)
    assert all(p.status == "ok" for p in registry.plugins if p.builtin)
    assert registry.get("norm", "scalenorm").provenance.distribution == "gptzoo-fake-good"
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.norm=scalenorm"], registry=registry)
    assert type(gptzoo.build_model(recipe, device="meta", registry=registry).ln_f).__name__ == "ScaleNorm"


STRICT_BROKEN = (
    f"plugin 'broken' (gptzoo-fake-broken 1.0) failed to load: RuntimeError: {BROKEN_MESSAGE}; "
    "fix or uninstall it, or leave strict mode (strict=True or GPTZOO_STRICT_PLUGINS) to skip it"
)


def test_strict_argument_makes_an_import_failure_fatal(fake_site: FakeSite) -> None:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    with pytest.raises(gptzoo.PluginError) as excinfo:
        gptzoo.get_registry(strict=True)
    assert str(excinfo.value) == STRICT_BROKEN
    assert isinstance(excinfo.value.__cause__, RuntimeError)


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_strict_env_makes_an_import_failure_fatal(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    monkeypatch.setenv("GPTZOO_STRICT_PLUGINS", value)
    with pytest.raises(gptzoo.PluginError) as excinfo:
        gptzoo.get_registry()
    assert str(excinfo.value) == STRICT_BROKEN
    # strict=False beats the environment
    assert report(gptzoo.get_registry(strict=False), "broken").status == "failed"


@pytest.mark.parametrize("value", ["", "0", "false", "off"])
def test_strict_env_off_values(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    monkeypatch.setenv("GPTZOO_STRICT_PLUGINS", value)
    assert report(gptzoo.get_registry(), "broken").status == "failed"


def test_no_plugins_env_skips_third_party_plugins(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    monkeypatch.setenv("GPTZOO_NO_PLUGINS", "1")
    monkeypatch.setenv("GPTZOO_STRICT_PLUGINS", "1")  # the broken plugin is not even imported
    registry = gptzoo.get_registry()
    assert [p.name for p in registry.plugins] == list(DEFAULT_PLUGINS)
    assert registry.names("norm") == gptzoo.get_registry(third_party=False).names("norm")
    assert "squared_relu" not in registry.names("activation")
    assert "gptzoo_fake_good" not in sys.modules and "gptzoo_fake_broken" not in sys.modules
    # third_party=True beats the environment
    assert "scalenorm" in gptzoo.get_registry(third_party=True, strict=False).names("norm")


def test_only_plugins_env_loads_only_the_distributions_it_names(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the suite relies on to be independent of what else is installed (tests/conftest.py)."""
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    monkeypatch.setenv("GPTZOO_ONLY_PLUGINS", " GPTZOO_Fake.Good ,")  # compared as PEP 503 names
    registry = gptzoo.get_registry(strict=True)  # the broken plugin is not even imported
    assert [p.distribution for p in registry.plugins if not p.builtin] == ["gptzoo-fake-good"]
    assert registry.get("norm", "scalenorm").provenance.distribution == "gptzoo-fake-good"
    assert "gptzoo_fake_broken" not in sys.modules
    monkeypatch.setenv("GPTZOO_ONLY_PLUGINS", "")
    assert [p.name for p in gptzoo.get_registry().plugins] == list(DEFAULT_PLUGINS)
    monkeypatch.delenv("GPTZOO_ONLY_PLUGINS")
    assert {"gptzoo-fake-good", "gptzoo-fake-broken"} <= {p.distribution for p in gptzoo.get_registry().plugins}


def test_misspelled_hook_is_reported_with_pluggys_message(fake_site: FakeSite) -> None:
    fake_site.add("typo", "gptzoo_fake_typo", TYPO)
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    pm = gptzoo.get_plugin_manager()
    registry = gptzoo.registry.registry_from(pm)
    module = sys.modules["gptzoo_fake_typo"]
    assert report(registry, "typo") == PluginInfo(
        "typo",
        "gptzoo_fake_typo",
        "gptzoo-fake-typo",
        "1.0",
        builtin=False,
        status="failed",
        error=f"PluginValidationError: unknown hook 'register_norm' in plugin {module!r}",
    )
    assert not pm.has_plugin("typo") and not pm.is_registered(module)  # unregistered again
    assert "register_norm" not in registry.names("norm")
    assert report(registry, "good").status == "ok"
    with pytest.raises(gptzoo.PluginError) as excinfo:
        gptzoo.get_registry(strict=True)
    assert str(excinfo.value).startswith(
        "plugin 'typo' (gptzoo-fake-typo 1.0) failed to load: "
        "PluginValidationError: unknown hook 'register_norm' in plugin"
    )


def test_hook_with_wrong_argument_name_is_reported(fake_site: FakeSite) -> None:
    fake_site.add("badsig", "gptzoo_fake_badsig", BAD_SIGNATURE)
    info = report(gptzoo.get_registry(), "badsig")
    assert info.status == "failed"
    assert info.error.startswith("PluginValidationError: Plugin 'badsig' for hook 'register_activations'")
    assert "Argument(s) {'reg'} are declared in the hookimpl but can not be found in the hookspec" in info.error
    with pytest.raises(gptzoo.PluginError, match=r"^plugin 'badsig' \(gptzoo-fake-badsig 1\.0\) failed to load"):
        gptzoo.get_registry(strict=True)


def test_plugin_rejected_by_register_is_not_left_in_the_manager(fake_site: FakeSite) -> None:
    fake_site.add(
        "halfsig",
        "gptzoo_fake_halfsig",
        """
        @gptzoo.hookimpl
        def register_activations(register):  # valid, and registered first (dir() order)
            register("half", object)

        @gptzoo.hookimpl
        def register_norms(reg):  # invalid argument name
            reg("halfnorm", object)
    """,
    )
    pm = gptzoo.get_plugin_manager()
    assert [r.status for r in pm.reports if r.name == "halfsig"] == ["failed"]
    module = sys.modules["gptzoo_fake_halfsig"]
    assert [i.plugin for i in pm.hook.register_activations.get_hookimpls() if i.plugin is module] == []
    assert not pm.has_plugin("halfsig")


def test_plugin_raising_in_its_hook_is_reported(fake_site: FakeSite) -> None:
    fake_site.add(
        "raiser",
        "gptzoo_fake_raiser",
        """
        @gptzoo.hookimpl
        def register_norms(register):
            register("raisernorm", object)
            raise ValueError("no GPU found")
    """,
    )
    registry = gptzoo.get_registry()
    info = report(registry, "raiser")
    assert info.status == "failed" and "ValueError" in info.error and "no GPU found" in info.error
    assert "raisernorm" not in registry.names("norm")  # all of a plugin's registrations, or none
    with pytest.raises(
        gptzoo.PluginError,
        match=r"^plugin 'raiser' \(gptzoo-fake-raiser 1\.0\) failed while registering: ValueError: no GPU found; ",
    ):
        gptzoo.get_registry(strict=True)


def test_a_builtin_name_registered_again_is_shadowed_not_a_failure(fake_site: FakeSite) -> None:
    """Without override=True the bare name stays the built-in's (shipped recipes keep their meaning);
    the plugin's is reachable qualified, and reported shadowed."""
    fake_site.add("dup", "gptzoo_fake_dup", rmsnorm_replacement(override=False))
    registry = gptzoo.get_registry(strict=True)
    assert report(registry, "dup").status == "ok"
    entry = registry.get("norm", "rmsnorm")
    assert entry.provenance == BUILTIN_NORMS and entry.overrides is None
    assert registry.get("norm", "gptzoo:rmsnorm") is entry
    theirs = registry.get("norm", "gptzoo-fake-dup:rmsnorm")
    assert theirs.factory.__name__ == "MyRMSNorm" and theirs.qualified_name == "gptzoo-fake-dup:rmsnorm"
    assert registry.get("norm", "GPTZOO_Fake.Dup:rmsnorm") is theirs  # the distribution as PEP 503 compares it
    assert registry.note(entry) is None
    assert registry.note(theirs) == (
        f"shadowed: 'rmsnorm' means the norm of gptzoo {GPTZOO_VERSION}; write 'gptzoo-fake-dup:rmsnorm' (or register "
        "it with override=True)"
    )
    assert [e.qualified_name for e in registry.all_entries("norm") if e.name == "rmsnorm"] == [
        "gptzoo:rmsnorm",
        "gptzoo-fake-dup:rmsnorm",
    ]
    model = gptzoo.build_model(
        gptzoo.load_recipe("llama-tiny", ["model.norm=gptzoo-fake-dup:rmsnorm"], registry=registry),
        device="meta",
        registry=registry,
    )
    assert type(model.blocks[0].ln_1).__name__ == "MyRMSNorm"


def test_override_replaces_the_builtin_and_records_it(fake_site: FakeSite) -> None:
    fake_site.add("override", "gptzoo_fake_override", rmsnorm_replacement(override=True))
    registry = gptzoo.get_registry(strict=True)
    assert report(registry, "override").status == "ok"
    entry = registry.get("norm", "rmsnorm")
    assert entry.provenance == Provenance("gptzoo_fake_override", "gptzoo-fake-override", "1.0")
    assert entry.overrides == BUILTIN_NORMS
    assert str(entry.overrides) == f"gptzoo_plugins.norms (gptzoo {GPTZOO_VERSION})"
    assert entry.factory.__name__ == "MyRMSNorm"
    assert registry.get("norm", "layernorm").overrides is None
    replaced = registry.get("norm", "gptzoo:rmsnorm")  # the replaced entry stays reachable qualified
    assert replaced.provenance == BUILTIN_NORMS
    assert registry.note(replaced) == (
        "replaced by gptzoo_fake_override (gptzoo-fake-override 1.0) (override=True); write 'gptzoo:rmsnorm'"
    )
    recipe = gptzoo.load_recipe("llama-tiny", registry=registry)  # norm = { name = "rmsnorm", eps = 1e-5 }
    model = gptzoo.build_model(recipe, device="meta", registry=registry)
    assert type(model.blocks[0].ln_1).__name__ == "MyRMSNorm" and model.blocks[0].ln_1.eps == 1e-5


def test_unknown_component_suggests_the_closest_name(fake_site: FakeSite) -> None:
    builtin_only = gptzoo.get_registry(third_party=False)
    norms = builtin_only.names("norm")
    assert "rmsnorm" in norms
    with pytest.raises(gptzoo.UnknownComponentError) as excinfo:
        builtin_only.get("norm", "rmsnrom")
    assert str(excinfo.value) == f"unknown norm 'rmsnrom'; did you mean 'rmsnorm'? (available: {', '.join(norms)})"
    assert (excinfo.value.kind, excinfo.value.name, excinfo.value.available) == ("norm", "rmsnrom", norms)
    with pytest.raises(gptzoo.UnknownComponentError, match=r"^unknown norm 'RMSNorm'"):
        builtin_only.get("norm", "RMSNorm")  # names match exactly
    with pytest.raises(gptzoo.UnknownComponentError) as excinfo:
        builtin_only.get("norm", "zzz")
    assert str(excinfo.value) == f"unknown norm 'zzz' (available: {', '.join(norms)})"
    # plugin names are listed too, and a recipe reports the problem with its key path
    fake_site.add("good", "gptzoo_fake_good", SCALENORM)
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        gptzoo.load_recipe("gpt2-tiny", ["model.norm=rmsnrom"])
    available = gptzoo.get_registry().available("norm")
    assert "scalenorm" in available
    assert str(excinfo.value) == (
        f"--set model.norm=rmsnrom: [model] norm: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? (available: "
        f"{', '.join(available)})"
    )


# --- subprocesses: import side effects and the CLI -----------------------------------------------


def test_import_loads_no_plugins(cli_site: FakeSite) -> None:
    # Strict mode with a broken plugin installed: loading plugins at import would make it fail.
    code = (
        "import sys, gptzoo; "
        "print(any(m.startswith('gptzoo_plugins') for m in sys.modules)); "
        "print(any(m.startswith(('gptzoo_sqrelu', 'gptzoo_fake')) for m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_site.env(GPTZOO_STRICT_PLUGINS="1"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "False\nFalse\n", "")


@pytest.fixture(scope="module")
def plugins_json(cli_site: FakeSite) -> subprocess.CompletedProcess[str]:
    return run_gptzoo("plugins", "--json", env=cli_site.env())


def _rows(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stderr
    return {row["name"]: row for row in json.loads(proc.stdout)}


def test_cli_plugins_lists_the_example_plugin(plugins_json: subprocess.CompletedProcess[str]) -> None:
    require_example()
    assert _rows(plugins_json)["sqrelu"] == {
        "name": "sqrelu",
        "module": "gptzoo_sqrelu",
        "distribution": "gptzoo-sqrelu",
        "version": "0.1.0",
        "builtin": False,
        "status": "ok",
        "error": None,
        "warning": None,
        "refused": [],
        "contract": 2,
        "registered": ["activation:squared_relu"],
        "notes": [],
    }


def test_cli_plugins_lists_a_failed_plugin_and_exits_0(plugins_json: subprocess.CompletedProcess[str]) -> None:
    rows = _rows(plugins_json)
    assert plugins_json.stderr == ""
    assert rows["broken"] == {
        "name": "broken",
        "module": "gptzoo_fake_cli_broken",
        "distribution": "gptzoo-fake-broken",
        "version": "1.0",
        "builtin": False,
        "status": "failed",
        "error": f"RuntimeError: {BROKEN_MESSAGE}",
        "warning": None,
        "refused": [],
        "contract": None,
        "registered": [],
        "notes": [],
    }
    assert rows["good"]["status"] == "ok" and rows["good"]["registered"] == ["norm:scalenorm"]
    builtin_norms = gptzoo.get_registry(third_party=False).names("norm")
    assert rows["gptzoo_plugins.norms"]["registered"] == [f"norm:{name}" for name in builtin_norms]
    assert [name for name, row in rows.items() if row["builtin"]] == list(DEFAULT_PLUGINS)


def test_cli_build_with_a_plugin_component(cli_site: FakeSite) -> None:
    proc = run_gptzoo("build", "gpt2-tiny", "--set", "model.norm=scalenorm", "--json", env=cli_site.env())
    assert proc.returncode == 0, proc.stderr
    norm = next(c for c in json.loads(proc.stdout)["components"] if c["key"] == "norm")
    assert norm == {
        "key": "norm",
        "kind": "norm",
        "name": "scalenorm",
        "params": {},
        "plugin": "gptzoo_fake_cli_good",
        "distribution": "gptzoo-fake-good",
        "version": "1.0",
        "overrides": None,
    }
    # the broken plugin is a warning, not an error (rich may wrap it: compare words)
    assert " ".join(proc.stderr.split()) == (
        f"warning: plugin 'broken' (gptzoo-fake-broken 1.0) failed: RuntimeError: {BROKEN_MESSAGE}; "
        "see `gptzoo plugins`"
    )


@pytest.fixture(scope="module")
def strict_build(cli_site: FakeSite) -> subprocess.CompletedProcess[str]:
    return run_gptzoo(
        "build", "gpt2-tiny", "--set", "model.norm=scalenorm", env=cli_site.env(GPTZOO_STRICT_PLUGINS="1")
    )


def test_cli_strict_plugin_failure_exits_2_without_traceback(strict_build: subprocess.CompletedProcess[str]) -> None:
    assert strict_build.returncode == 2
    assert strict_build.stdout == ""
    assert "Traceback" not in strict_build.stderr
    assert " ".join(strict_build.stderr.split()) == f"error: {STRICT_BROKEN}"


def test_cli_strict_plugin_failure_is_one_line(strict_build: subprocess.CompletedProcess[str]) -> None:
    assert strict_build.stderr == f"error: {STRICT_BROKEN}\n"

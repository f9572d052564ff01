"""Start-up: the light commands (``--help``, ``recipes``, ``list``, ``plugins``) import neither torch,
transformers, tiktoken, the tokenizer module nor the recipe validator, and
registration by reference (``register(name, "module:attribute", doc=...)``) lists a component without
importing it, imports it when it is first needed, and reports a reference that cannot be imported as
the plugin's error, naming the plugin, its distribution and the reference."""

from __future__ import annotations

import builtins
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_error, run_json
from fakedist import SCALENORM_CLASS, FakeSite
from test_catalog import rmsnorm_recipes
from test_plugins import report

import gptzoo
from gptzoo.cli import main
from gptzoo.plugin_manager import ONLY_PLUGINS_ENV
from gptzoo.recipe import shipped_recipes
from gptzoo.testing import run_conformance

REPO = Path(__file__).resolve().parents[2]

IMPL = (
    SCALENORM_CLASS
    + """

class Needy(nn.Module):
    def __init__(self, dim: int, *, eps: float) -> None:
        super().__init__()


NOT_A_FACTORY = 42
"""
)
"""A plugin's implementation module (imports torch)."""
DOC = "ScaleNorm: g * x / max(||x||, eps), one learned scalar g (Nguyen & Salazar, 2019)."
LAZY = f"""
@gptzoo.hookimpl
def register_norms(register):
    register("scalenorm", "gptzoo_fake_lazy_impl:ScaleNorm", doc={DOC!r})
    register("ghostnorm", "gptzoo_fake_missing:GhostNorm", doc="a module that does not exist")
    register("nonorm", "gptzoo_fake_lazy_impl:NoSuchNorm", doc="an attribute that does not exist")
    register("brokennorm", "gptzoo_fake_broken_impl:Norm", doc="a module whose import raises")
    register("numbernorm", "gptzoo_fake_lazy_impl:NOT_A_FACTORY", doc="not callable")
    register("needynorm", "gptzoo_fake_lazy_impl:Needy", doc="a parameter without a default")
"""
"""A plugin that registers everything by reference: its module imports nothing but gptzoo."""
LIGHT_COMMANDS = [
    ["--help"],
    ["recipes"],
    ["recipes", "--json"],
    ["list"],
    ["list", "--json"],
    ["list", "norm", "scalenorm", "--json"],
    ["recipes", "--uses", "rmsnorm", "--json"],
    ["plugins"],
    ["plugins", "--json"],
]
PROBE = """
import json, sys
from gptzoo.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:  # --help
    code = exc.code
heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("torch", "transformers", "tiktoken")
    or m in ("gptzoo.tokenizer", "gptzoo.recipe.validate")
    or m.endswith("_fake_lazy_impl")
)
print(json.dumps([code, heavy]), file=sys.stderr)
"""
"""Run a command in a fresh interpreter; on stderr's last line, its exit status and the modules it imported of
torch, transformers, tiktoken, gptzoo's tokenizer and recipe validator, and the lazy plugin's implementation."""


@pytest.fixture
def lazy_site(fake_site: FakeSite) -> FakeSite:
    fake_site.add("lazy", "gptzoo_fake_lazy", LAZY)
    (fake_site.root / "gptzoo_fake_lazy_impl.py").write_text(IMPL, encoding="utf-8")
    (fake_site.root / "gptzoo_fake_broken_impl.py").write_text("raise RuntimeError('no frobnicator')\n")
    fake_site.modules += ["gptzoo_fake_lazy_impl", "gptzoo_fake_broken_impl"]
    return fake_site


def who(name: str) -> str:
    return f"norm {name!r} from gptzoo_fake_lazy (gptzoo-fake-lazy 1.0)"


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=" ".join)
def test_light_commands_import_neither_torch_nor_the_tokenizer_nor_the_validator(
    lazy_site: FakeSite, argv: list[str]
) -> None:
    env = lazy_site.env(**{ONLY_PLUGINS_ENV: "gptzoo-fake-lazy"})  # the example plugin imports torch itself
    env["PYTHONPATH"] += os.pathsep + str(REPO)  # the gptzoo under test
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, env=env, timeout=120
    )
    assert json.loads(done.stderr.splitlines()[-1]) == [0, []], done.stderr
    if argv[-1] == "--json":
        rows = json.loads(done.stdout)
        if argv[0] == "list" and len(argv) > 2:
            assert [(r["name"], r["doc"], r["distribution"]) for r in rows] == [("scalenorm", DOC, "gptzoo-fake-lazy")]
        elif argv[0] == "list":
            n_builtin = len(list(gptzoo.get_registry(third_party=False).all_entries()))
            assert n_builtin > 0 and len(rows) == n_builtin + 6  # all listed, none imported
        elif argv[0] == "plugins":
            lazy = next(r for r in rows if r["name"] == "lazy")
            assert (lazy["status"], len(lazy["registered"])) == ("ok", 6)
        elif "--uses" in argv:
            assert [r["name"] for r in rows] == rmsnorm_recipes()
        else:
            assert [r["name"] for r in rows] == list(shipped_recipes())
    elif argv[0] == "--help":
        assert done.stdout.startswith("usage: gptzoo [-h] [--version] COMMAND ...")


def test_ctrl_c_while_a_command_imports_the_library_did_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "gptzoo.loader":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert main(["build", "gpt2-tiny", "--json"]) == 130
    captured = capsys.readouterr()
    message = "interrupted: nothing was done"
    assert (captured.err, json.loads(captured.out)) == (f"{message}\n", {"error": message, "exit": 130})


def test_a_lazy_component_is_imported_when_first_built(lazy_site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    registry = gptzoo.get_registry()
    entry = registry.get("norm", "scalenorm")
    assert (str(entry.target), entry.doc, "gptzoo_fake_lazy_impl" in sys.modules) == (
        "gptzoo_fake_lazy_impl:ScaleNorm",
        DOC,
        False,
    )
    summary = run_json(capsys, "build", "gpt2-tiny", "--set", "model.norm=scalenorm")
    norm = next(c for c in summary["components"] if c["key"] == "norm")
    assert (norm["name"], norm["distribution"], norm["params"]) == ("scalenorm", "gptzoo-fake-lazy", {})
    baseline = run_json(capsys, "build", "gpt2-tiny")["params"]["total"]
    assert summary["params"]["total"] - baseline == 5 * (1 - 2 * 64)  # 5 norms of 1 parameter, not 2 x 64
    assert sys.modules["gptzoo_fake_lazy_impl"].ScaleNorm is entry.factory


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (
            "ghostnorm",
            "is registered as 'gptzoo_fake_missing:GhostNorm', which cannot be imported: ModuleNotFoundError: No "
            "module named 'gptzoo_fake_missing'; fix the plugin, or choose another norm",
        ),
        (
            "nonorm",
            "is registered as 'gptzoo_fake_lazy_impl:NoSuchNorm', which cannot be imported: AttributeError: module "
            "'gptzoo_fake_lazy_impl' has no attribute 'NoSuchNorm'; fix the plugin, or choose another norm",
        ),
        (
            "brokennorm",
            "is registered as 'gptzoo_fake_broken_impl:Norm', which cannot be imported: RuntimeError: no "
            "frobnicator; fix the plugin, or choose another norm",
        ),
        (
            "numbernorm",
            "is registered as 'gptzoo_fake_lazy_impl:NOT_A_FACTORY', a factory that is not callable: 42; pass the "
            "class or function that builds it",
        ),
        (
            "needynorm",
            "is registered as 'gptzoo_fake_lazy_impl:Needy', a factory whose parameter 'eps' has no default; give "
            "every parameter a default (a recipe may leave any out, and the model passes only dim)",
        ),
    ],
)
def test_a_reference_that_cannot_be_imported_is_the_plugins_error_where_it_is_used(
    lazy_site: FakeSite, capsys: pytest.CaptureFixture[str], name: str, error: str
) -> None:
    assert run_error(capsys, "build", "gpt2-tiny", "--set", f"model.norm={name}") == f"error: {who(name)} {error}"
    assert report(gptzoo.get_registry(), "lazy").status == "ok"  # listing and resolving never import it
    with pytest.raises(gptzoo.PluginError) as excinfo:
        callable(gptzoo.get_registry().get("norm", name).factory)
    assert str(excinfo.value) == f"{who(name)} {error}"


def test_the_kit_fails_every_check_of_a_reference_that_cannot_be_imported(lazy_site: FakeSite) -> None:
    registry = gptzoo.get_registry()
    results = run_conformance(registry, [registry.get("norm", "ghostnorm")])
    message = (
        f"{who('ghostnorm')} is registered as 'gptzoo_fake_missing:GhostNorm', which cannot be imported: "
        "ModuleNotFoundError: No module named 'gptzoo_fake_missing'; fix the plugin, or choose another norm"
    )
    # a norm's 18 checks (decode_plan twice: with biases and without), each failing with the one message
    assert len(results) == 18 and {(r.status, r.detail) for r in results} == {("failed", message)}


def test_the_listing_of_a_reference_is_that_of_its_class(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add(
        "both",
        "gptzoo_fake_both",
        IMPL.replace("import torch\n", "import torch\n\nimport gptzoo\n")
        + f"""

@gptzoo.hookimpl
def register_norms(register):
    register("byclass", ScaleNorm)
    register("byref", "gptzoo_fake_both:ScaleNorm", doc={DOC!r})
""",
    )
    by_class, by_ref = run_json(capsys, "list", "norm", "byclass"), run_json(capsys, "list", "norm", "byref")
    names = {"name": "byclass", "qualified_name": "gptzoo-fake-both:byclass"}
    assert [{**row, **names} for row in by_ref] == by_class and by_class[0]["doc"] == DOC
    registry = gptzoo.get_registry()
    assert registry.get("norm", "byref").factory is registry.get("norm", "byclass").factory


def test_every_builtin_is_listed_as_registering_its_class_would() -> None:
    explicit = {("attention", "causal"): "Causal self-attention through scaled_dot_product_attention"}
    for entry in gptzoo.get_registry(third_party=False).all_entries():
        assert str(entry.target) == f"{entry.factory.__module__}:{entry.factory.__qualname__}"
        assert entry.factory.__module__ == entry.provenance.plugin.replace("gptzoo_plugins.", "gptzoo_plugins._")
        first_line = inspect.getdoc(entry.factory).split("\n")[0].strip()
        assert entry.doc == explicit.get((entry.kind, entry.name), first_line), (entry.kind, entry.name)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            "register('lazy', 'gptzoo_fake_x.norms.ScaleNorm', doc='d')",
            "with a reference that is not 'module:attribute': 'gptzoo_fake_x.norms.ScaleNorm'; name the factory as "
            "an entry point does, e.g. 'gptzoo_dyt.norms:DyT'",
        ),
        (
            "register('lazy', 'gptzoo_fake_x:Scale Norm', doc='d')",
            "with a reference that is not 'module:attribute': 'gptzoo_fake_x:Scale Norm'; name the factory as an "
            "entry point does, e.g. 'gptzoo_dyt.norms:DyT'",
        ),
        (
            "register('lazy', 'gptzoo_fake_x:ScaleNorm')",
            "by reference 'gptzoo_fake_x:ScaleNorm' without a doc; pass doc, the line listings show without "
            "importing the factory",
        ),
    ],
)
def test_a_malformed_reference_fails_the_plugin_at_registration(fake_site: FakeSite, call: str, error: str) -> None:
    fake_site.add("ref", "gptzoo_fake_ref", f"@gptzoo.hookimpl\ndef register_norms(register):\n    {call}\n")
    info = report(gptzoo.get_registry(), "ref")
    assert (info.status, info.error) == (
        "failed",
        f"gptzoo_fake_ref (gptzoo-fake-ref 1.0) registered norm 'lazy' {error}",
    )

"""The contract table (gptzoo.hookspecs.CONTRACTS) against everything that must agree with it: the hook
specs' docstrings, the interfaces, the recipe schema, the builder and the registered components; and
the builder's enforcement of it on plugins that break it."""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
from fakedist import FakeSite
from torch import nn

import gptzoo
from gptzoo import hookspecs, interfaces
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.model.build import build_model
from gptzoo.plugin_manager import DEFAULT_PLUGINS
from gptzoo.recipe import COMPONENT_KEYS, ModelSpec, load_recipe


def _names(text: str) -> list[str]:
    """``a``, ``b(x)``, none -> ['a', 'b']"""
    return [] if text.strip().rstrip(".") == "none" else re.findall(r"``(\w+)", text)


@pytest.mark.parametrize("kind", KINDS)
def test_hook_docstring_says_what_the_table_says(kind: str) -> None:
    contract = CONTRACTS[kind]
    hook = getattr(hookspecs, contract.hook, None)
    assert hook is not None, f"no hook spec {contract.hook} for kind {kind!r}"
    doc = " ".join(hook.__doc__.split())
    factory = re.search(r"Factory: ``factory\((.*?)\) -> (\w+)``", doc)
    assert factory, f"{contract.hook}: no 'Factory: ``factory(...) -> Interface``' line"
    args = [a.strip().split(":")[0] for a in factory.group(1).split(",") if a.strip() not in ("*", "**params")]
    assert sorted(args) == sorted(contract.given_by_model), f"{contract.hook} factory arguments {args}"
    assert factory.group(2) == contract.interface
    members = re.search(r"Members: (.*?)(?= Optional:|$)", doc)
    optional = re.search(r"Optional: (.*?)$", doc)
    assert members and _names(members.group(1)) == list(contract.members), f"{contract.hook} Members"
    assert optional and _names(optional.group(1)) == list(contract.optional), f"{contract.hook} Optional"


def test_every_hook_spec_is_a_kind_of_the_table() -> None:
    specs = sorted(name for name in dir(hookspecs) if name.startswith("register_"))
    assert specs == sorted(c.hook for c in CONTRACTS.values())


@pytest.mark.parametrize("kind", KINDS)
def test_interface_declares_the_members(kind: str) -> None:
    contract = CONTRACTS[kind]
    interface = getattr(interfaces, contract.interface, None)
    assert interface is not None, f"gptzoo.interfaces has no {contract.interface} for kind {kind!r}"
    declared = set(dir(interface)) | set(getattr(interface, "__annotations__", {}))
    assert set(contract.members) <= declared, f"{contract.interface} lacks {set(contract.members) - declared}"


def test_recipe_schema_has_one_component_key_per_model_kind() -> None:
    table = [c.recipe_key for c in CONTRACTS.values() if c.recipe_key is not None]
    assert list(COMPONENT_KEYS) == table
    typed = [f.name for f in fields(ModelSpec) if f.type == "Component"]
    assert typed == table
    attrs = {f.name for f in fields(ModelSpec)}
    for contract in CONTRACTS.values():
        assert {attr for _, attr in contract.structural} <= attrs, contract.kind
        assert set(contract.components) <= set(KINDS), contract.kind


def test_build_makes_every_component_kind_of_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = gptzoo.get_registry()
    built: dict[str, int] = {}

    def counting(kind: str, factory):
        @functools.wraps(factory)  # keeps the signature that validation reads
        def counted(*args, **kwargs):
            built[kind] = built.get(kind, 0) + 1
            return factory(*args, **kwargs)

        return counted

    for kind in COMPONENT_KEYS:
        for name, entry in list(registry._entries[kind].items()):
            registry._entries[kind][name] = replace(entry, factory=counting(kind, entry.factory))
    recipe = load_recipe("gpt2-tiny", registry=registry)
    build_model(recipe, device="meta", registry=registry)
    n = recipe.model.n_layer
    # per block: 2 norms, attention, mlp and its activation; then the position and the final norm
    assert built == {"norm": 2 * n + 1, "activation": n, "mlp": n, "position": 1, "attention": n}


def test_every_default_plugin_registers_documented_components(registry: gptzoo.Registry) -> None:
    by_plugin: dict[str, list[str]] = {}
    for entry in registry.entries():
        by_plugin.setdefault(entry.provenance.plugin, []).append(entry.name)
        if entry.provenance.distribution == "gptzoo":
            assert entry.doc, f"{entry.kind} {entry.name} has no one-line doc"
    for module in DEFAULT_PLUGINS:
        importlib.import_module(module)
        assert by_plugin.get(module), f"{module} registers nothing"
    for kind in KINDS:
        assert registry.names(kind), f"no component of kind {kind!r} is registered"


# --- the builder enforces the contract on plugins ---------------------------------------------------------

NO_DIM = """
class NoDim(__import__("torch").nn.Module):
    def __init__(self):
        super().__init__()

@gptzoo.hookimpl
def register_norms(register):
    register("nodim", NoDim, doc="a norm whose factory ignores the contract")
"""

RAISES = """
def exploding(dim, *, eps=1e-5):
    raise RuntimeError("boom")

@gptzoo.hookimpl
def register_norms(register):
    register("exploding", exploding, doc="a norm factory that raises")
"""

NO_CPROJ = """
import torch

class Plain(torch.nn.Module):
    def __init__(self, d_model, d_ff, *, activation, bias):
        super().__init__()
        self.fc = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.fc(x)

@gptzoo.hookimpl
def register_mlps(register):
    register("plain", Plain, doc="an mlp without c_proj or flops")
"""

NOT_A_MODULE = """
@gptzoo.hookimpl
def register_activations(register):
    register("lambda_act", lambda: (lambda x: x), doc="an activation that is a plain function")
"""


@pytest.fixture
def site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    monkeypatch.delenv("GPTZOO_STRICT_PLUGINS", raising=False)
    return fake_site


@pytest.mark.parametrize(
    ("source", "override", "message"),
    [
        (
            NO_DIM,
            "model.norm=nodim",
            "norm 'nodim' from gptzoo_fake_nodim (gptzoo-fake-nodim 1.0) failed to build: TypeError: "
            "NoDim.__init__() got an unexpected keyword argument 'dim'; fix the plugin, or choose another norm",
        ),
        (
            RAISES,
            "model.norm=exploding",
            "norm 'exploding' from gptzoo_fake_raises (gptzoo-fake-raises 1.0) failed to build: RuntimeError: boom; "
            "fix the plugin, or choose another norm",
        ),
        (
            NO_CPROJ,
            "model.mlp=plain",
            "mlp 'plain' from gptzoo_fake_nocproj (gptzoo-fake-nocproj 1.0) built a Plain without c_proj, flops, "
            "which the mlp contract requires (gptzoo.hookspecs.CONTRACTS, interface gptzoo.interfaces.MLP); "
            "fix the plugin, or choose another mlp",
        ),
        (
            NOT_A_MODULE,
            "model.activation=lambda_act",
            "activation 'lambda_act' from gptzoo_fake_notmodule (gptzoo-fake-notmodule 1.0) built a function "
            "without nn.Module, which the activation contract requires (gptzoo.hookspecs.CONTRACTS, interface "
            "gptzoo.interfaces.Activation); fix the plugin, or choose another activation",
        ),
    ],
    ids=["wrong-signature", "raises", "missing-members", "not-a-module"],
)
def test_a_component_that_breaks_its_contract_is_refused_at_build(
    site: FakeSite, capsys: pytest.CaptureFixture[str], source: str, override: str, message: str
) -> None:
    module = re.search(r"from (gptzoo_fake_\w+)", message).group(1)
    site.add(module.removeprefix("gptzoo_fake_"), module, source)
    for device in ("meta", "cpu"):
        with pytest.raises(gptzoo.PluginError) as excinfo:
            build_model(load_recipe("gpt2-tiny", [override]), device=device)
        assert str(excinfo.value) == message
    from cli_run import run_error

    assert run_error(capsys, "build", "gpt2-tiny", "--set", override) == f"error: {message}"


def test_a_model_that_does_not_fit_in_memory_is_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gptzoo.model.build.available_bytes", lambda device: 16 * 2**30)
    out = tmp_path / "init"
    message = run_error_of(capsys, "build", "gpt2-small", "--set", "model.n_layer=1000", "--out", str(out))
    assert message == (
        "error: recipe 'gpt2-small' needs 26.55 GiB for its float32 weights on cpu, and 16.00 GiB is free; make the "
        "model smaller (n_layer, n_embd, d_ff, vocab_size) or summarize it without --out (gptzoo build works on the "
        "meta device)"
    )
    assert not out.exists() and not list(tmp_path.iterdir())
    # the summary itself needs no memory: the meta device
    assert gptzoo.cli.main(["build", "gpt2-small", "--set", "model.n_layer=1000", "--json"]) == 0


def run_error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from cli_run import run_error

    return run_error(capsys, *argv)


def test_builtin_components_satisfy_their_protocols(registry: gptzoo.Registry) -> None:
    model = build_model(load_recipe("llama-tiny", registry=registry), device="meta", registry=registry)
    block = model.blocks[0]
    for kind, module in (
        ("norm", block.ln_1),
        ("mlp", block.mlp),
        ("attention", block.attn),
        ("position", model.position),
    ):
        interface = getattr(interfaces, CONTRACTS[kind].interface)
        assert isinstance(module, interface), kind
        assert isinstance(module, nn.Module)

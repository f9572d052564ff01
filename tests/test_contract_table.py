"""The contract table (gptzoo.hookspecs.CONTRACTS) against everything that must agree with it: the hook
specs' docstrings, the interfaces, the recipe schema, the builder and the registered components; and
the builder's enforcement of it on plugins that break it."""

from __future__ import annotations

import functools
import importlib
import os
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
from fakedist import FakeSite
from torch import nn

import gptzoo
from gptzoo import hookspecs, interfaces, plugin_code
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.inference.sampling import SamplerChain
from gptzoo.model.build import build_model
from gptzoo.plugin_manager import DEFAULT_PLUGINS, SUBSYSTEMS, get_plugin_manager
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
    given = contract.given_by_model - set(contract.builders)
    assert sorted(args) == sorted(given), f"{contract.hook} factory arguments {args}"
    for builder in contract.builders:  # optional: passed to a factory that names it
        assert f"A factory that also names ``{builder}`` receives ``{builder}(dim) ->" in doc, contract.hook
    assert factory.group(2) == contract.interface
    members = re.search(r"Members: (.*?)(?= Optional:|$)", doc)
    optional = re.search(r"Optional: (.*?)(?= On the factory:|$)", doc)
    on_factory = re.search(r"On the factory: (.*?)$", doc)
    assert members and _names(members.group(1)) == list(contract.members), f"{contract.hook} Members"
    assert optional and _names(optional.group(1)) == list(contract.optional), f"{contract.hook} Optional"
    assert on_factory and _names(on_factory.group(1)) == list(contract.factory_optional), f"{contract.hook} factory"


def test_every_hook_spec_is_a_kind_of_the_table_or_a_subsystem_hook() -> None:
    specs = sorted(name for name in dir(hookspecs) if name.startswith("register_"))
    assert specs == sorted([*(c.hook for c in CONTRACTS.values()), *hookspecs.OTHER_HOOKS])


@pytest.mark.parametrize("name", SUBSYSTEMS)
def test_each_subsystem_hook_spec_has_one_intake_and_the_plugin_manager_adds_both(name: str) -> None:
    module = importlib.import_module(name)
    specs = sorted(n for n in dir(module) if n.startswith("register_") and callable(getattr(module, n)))
    assert specs and specs == sorted(intake.hook for intake in module.INTAKES), name
    pm = get_plugin_manager(third_party=False)
    assert {intake.hook for intake in module.INTAKES} <= {intake.hook for intake in pm.intakes}
    assert all(hasattr(pm.hook, spec) for spec in specs)


@pytest.mark.parametrize("kind", KINDS)
def test_interface_declares_the_members(kind: str) -> None:
    contract = CONTRACTS[kind]
    interface = getattr(interfaces, contract.interface, None)
    assert interface is not None, f"gptzoo.interfaces has no {contract.interface} for kind {kind!r}"
    declared = set(dir(interface)) | set(getattr(interface, "__annotations__", {}))
    assert set(contract.members) <= declared, f"{contract.interface} lacks {set(contract.members) - declared}"
    typed = plugin_code.declared_members(contract.interface)  # what check_contract holds each member to
    assert set(contract.members) <= set(typed), f"{contract.interface} neither types nor defines {contract.members}"
    assert set(contract.positive) <= set(contract.members)


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
            registry._entries[kind][name] = replace(entry, target=counting(kind, entry.factory))
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


def norm_factory(name: str, body: str) -> str:
    """A plugin registering norm ``name`` whose factory runs ``body`` (one line)."""
    return f"""
def factory(dim, *, eps=1e-5):
    {body}

@gptzoo.hookimpl
def register_norms(register):
    register({name!r}, factory, doc="a norm factory that misbehaves")
"""


UNREADABLE_SIGNATURE = """
class Factory:
    @property
    def __signature__(self):
        raise RuntimeError("no signature today")

    def __call__(self, dim, *, eps=1e-5):
        raise AssertionError("never built")

@gptzoo.hookimpl
def register_norms(register):
    register("nosig", Factory(), doc="a norm factory whose signature cannot be read")
"""

UNPRINTABLE = """
class E(Exception):
    def __str__(self):
        raise RuntimeError

def factory(dim, *, eps=1e-5):
    raise E("boom")

@gptzoo.hookimpl
def register_norms(register):
    register("unprintable", factory, doc="a norm factory raising an exception that cannot be printed")
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
            "norm 'nodim' from gptzoo_fake_nodim (gptzoo-fake-nodim 1.0) has a factory that does not take dim by "
            "keyword, which the model passes to every norm (gptzoo.hookspecs.register_norms); add it to the factory's "
            "parameters, or choose another norm",
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
            "mlp 'plain' from gptzoo_fake_nocproj (gptzoo-fake-nocproj 1.0) built a Plain without flops, "
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
        (
            norm_factory("exiting", "import sys; sys.exit(3)"),
            "model.norm=exiting",
            "norm 'exiting' from gptzoo_fake_exits (gptzoo-fake-exits 1.0) failed to build: called sys.exit(3); "
            "fix the plugin, or choose another norm",
        ),
        (
            norm_factory("osexiting", "import os; os._exit(5)"),
            "model.norm=osexiting",
            "norm 'osexiting' from gptzoo_fake_osexits (gptzoo-fake-osexits 1.0) failed to build: called "
            "os._exit(5); fix the plugin, or choose another norm",
        ),
        (
            UNPRINTABLE,
            "model.norm=unprintable",
            "norm 'unprintable' from gptzoo_fake_unprintable (gptzoo-fake-unprintable 1.0) failed to build: E (its "
            "__str__ raised RuntimeError): E('boom'); fix the plugin, or choose another norm",
        ),
        (
            norm_factory("picky", "raise gptzoo.GptzooError('picky needs a GPU; build it with --device cuda')"),
            "model.norm=picky",
            "norm 'picky' from gptzoo_fake_gptzooerror (gptzoo-fake-gptzooerror 1.0): picky needs a GPU; build it "
            "with --device cuda",
        ),
        (
            UNREADABLE_SIGNATURE,
            "model.norm=nosig",
            "norm 'nosig' from gptzoo_fake_nosignature (gptzoo-fake-nosignature 1.0) has a signature that cannot "
            "be read: RuntimeError: no signature today; fix the plugin, or choose another norm",
        ),
    ],
    ids=[
        "wrong-signature",
        "raises",
        "missing-members",
        "not-a-module",
        "sys-exit",
        "os-exit",
        "unprintable",
        "gptzoo-error",
        "unreadable-signature",
    ],
)
def test_a_component_that_breaks_its_contract_is_refused_at_build(
    site: FakeSite,
    no_real_exit: object,
    capsys: pytest.CaptureFixture[str],
    source: str,
    override: str,
    message: str,
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
        "model smaller (n_layer, n_embd, d_ff, vocab_size, context_length) or summarize it without --out (gptzoo build "
        "works on the meta device)"
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


def test_ctrl_c_in_a_factory_stays_an_interrupt(site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    site.add("ctrlc", "gptzoo_fake_ctrlc", norm_factory("ctrlc", "raise KeyboardInterrupt"))
    with pytest.raises(KeyboardInterrupt):
        build_model(load_recipe("gpt2-tiny", ["model.norm=ctrlc"]), device="meta")
    assert gptzoo.cli.main(["build", "gpt2-tiny", "--set", "model.norm=ctrlc"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


# --- members of the type their interface declares, tensors a checkpoint can hold ---------------------------

TYPED = """
import torch
from torch import nn
from gptzoo_plugins._attentions import CausalSelfAttention
from gptzoo_plugins._mlps import DenseMLP
from gptzoo.interfaces import Position


def mlp(**members):
    def factory(d_model, d_ff, *, activation, bias):
        module = DenseMLP(d_model, d_ff, activation=activation, bias=bias)
        for name, value in members.items():
            setattr(module, name, value(module) if callable(value) else value)
        return module

    return factory


def seqattention(d_model, n_head, *, n_kv_head, head_dim, bias):
    module = CausalSelfAttention(d_model, n_head, n_kv_head=n_kv_head, head_dim=head_dim, bias=bias)
    module.c_proj = nn.Sequential(module.c_proj)
    return module


class Limited(Position):
    limit = None

    def __init__(self, *, n_embd, n_head, head_dim, context_length):
        super().__init__()
        self.max_positions = self.limit


class F64Buffer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("scale", torch.ones(dim, dtype=torch.float64))

    def forward(self, x):
        return x * self.weight


class IntBuffer(nn.Module):
    def __init__(self, dim, *, persistent=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=persistent)

    def forward(self, x):
        return x * self.weight


class IntParameter(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.inner = nn.Module()
        self.inner.steps = nn.Parameter(torch.zeros(dim, dtype=torch.bool), requires_grad=False)

    def forward(self, x):
        return x


class Aliased(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.scale = self.weight

    def forward(self, x):
        return x * self.scale


@gptzoo.hookimpl
def register_mlps(register):
    register("seqproj", mlp(c_proj=lambda m: nn.Sequential(m.c_proj)), doc="c_proj is a Sequential")
    register("noproj", mlp(c_proj=None), doc="c_proj is None")
    register("flopsnumber", mlp(flops=3), doc="flops is a number")


@gptzoo.hookimpl
def register_attentions(register):
    register("seqproj", seqattention, doc="c_proj is a Sequential")


@gptzoo.hookimpl
def register_positions(register):
    for name, limit in (("lots", "lots"), ("negative", -3), ("zero", 0), ("yes", True), ("float", 64.0)):
        register(name, type(name, (Limited,), {"limit": limit}), doc="max_positions is wrong")
    register("one", type("one", (Limited,), {"limit": 1}), doc="max_positions is 1")


@gptzoo.hookimpl
def register_norms(register):
    register("intbuf", IntBuffer, doc="an int64 persistent buffer")
    register("f64buf", F64Buffer, doc="a float64 persistent buffer")
    register("intparam", IntParameter, doc="a bool parameter")
    register("aliased", Aliased, doc="one parameter under two names")
"""
TYPED_FROM = "from gptzoo_fake_typed (gptzoo-fake-typed 1.0)"
TYPED_FIX = "fix the plugin, or choose another"
TYPED_CASES = {
    "model.mlp=seqproj": f"mlp 'seqproj' {TYPED_FROM} built a DenseMLP: its c_proj is a Sequential, the mlp contract "
    f"says nn.Linear (gptzoo.interfaces.MLP); {TYPED_FIX} mlp",
    "model.mlp=noproj": f"mlp 'noproj' {TYPED_FROM} built a DenseMLP: its c_proj is None, the mlp contract says "
    f"nn.Linear (gptzoo.interfaces.MLP); {TYPED_FIX} mlp",
    "model.mlp=flopsnumber": f"mlp 'flopsnumber' {TYPED_FROM} built a DenseMLP: its flops is 3, the mlp contract says "
    f"a method (gptzoo.interfaces.MLP); {TYPED_FIX} mlp",
    "model.attention=seqproj": f"attention 'seqproj' {TYPED_FROM} built a CausalSelfAttention: its c_proj is a "
    f"Sequential, the attention contract says nn.Linear (gptzoo.interfaces.Attention); {TYPED_FIX} attention",
    **{
        f"model.position={name}": f"position {name!r} {TYPED_FROM} built {built}: its max_positions is {shown}, the "
        "position contract says int | None, and at least 1 when an int (gptzoo.interfaces.Position); "
        f"{TYPED_FIX} position"
        for name, built, shown in (
            ("lots", "a lots", "'lots'"),
            ("negative", "a negative", "-3"),
            ("zero", "a zero", "0"),
            ("yes", "a yes", "True"),
            ("float", "a float", "64.0"),
        )
    },
    "model.norm=intbuf": f"norm 'intbuf' {TYPED_FROM} built an IntBuffer whose persistent buffer 'calls' holds int64 "
    "values (not floating point), and a checkpoint's weights are float32, bfloat16 or float16: create it in the "
    f"default dtype, or compute it in forward instead of storing it; {TYPED_FIX} norm",
    "model.norm=f64buf": f"norm 'f64buf' {TYPED_FROM} built a F64Buffer whose persistent buffer 'scale' holds float64 "
    "values (floating point), and a checkpoint's weights are float32, bfloat16 or float16: create it in the "
    f"default dtype, or compute it in forward instead of storing it; {TYPED_FIX} norm",
    'model.norm={ name = "intbuf", persistent = false }': f"norm 'intbuf' {TYPED_FROM} built an IntBuffer whose "
    "buffer 'calls' is registered with persistent=False, which no checkpoint restores (gptzoo loads weights into a "
    "model built on the meta device): compute it in forward from the constructor's arguments (as gptzoo's rope "
    f"does), or make it a persistent float buffer; {TYPED_FIX} norm",
    "model.norm=intparam": f"norm 'intparam' {TYPED_FROM} built an IntParameter whose parameter 'inner.steps' holds "
    "bool values (not floating point), and a checkpoint's weights are float32, bfloat16 or float16: create it in the "
    f"default dtype; {TYPED_FIX} norm",
}


@pytest.mark.parametrize("override", TYPED_CASES)
def test_a_member_of_the_wrong_type_or_a_tensor_no_checkpoint_holds_is_refused_at_build(
    site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str
) -> None:
    """Held to gptzoo.interfaces' annotations (not only hasattr), and to floating-point state, on the
    first built instance: before ``build --out`` writes a checkpoint that loading would refuse, or
    GPT.init_weights fails on a c_proj without .weight."""
    site.add("typed", "gptzoo_fake_typed", TYPED)
    for device in ("meta", "cpu"):
        with pytest.raises(gptzoo.PluginError) as excinfo:
            build_model(load_recipe("gpt2-tiny", [override]), device=device)
        assert str(excinfo.value) == TYPED_CASES[override]
    from cli_run import run_error

    out = tmp_path / "out"
    assert run_error(capsys, "build", "gpt2-tiny", "--set", override, "--out", str(out)) == (
        f"error: {TYPED_CASES[override]}"
    )
    assert not out.exists()


@pytest.mark.parametrize("override", ["model.position=one", "model.norm=aliased"])
def test_what_the_interfaces_allow_builds(site: FakeSite, override: str) -> None:
    """max_positions 1; one parameter under two names (the checkpoint writer copies it)."""
    site.add("typed", "gptzoo_fake_typed", TYPED)
    model = build_model(load_recipe("gpt2-tiny", [override]), device="cpu")
    assert all(t.is_floating_point() for t in model.state_dict().values())


# --- a factory's check ---------------------------------------------------------------------------------------

CHECKED = """
import torch
from gptzoo.interfaces import Sampler


class CheckedNorm(torch.nn.Module):
    check = {check}

    def __init__(self, dim, *, eps=1e-5):
        super().__init__()

    def forward(self, x):
        return x


class CheckedSampler(Sampler):
    check = {check}

    def __init__(self, *, p=0.5):
        self.p = p


@gptzoo.hookimpl
def register_norms(register):
    register("checked", CheckedNorm, doc="a norm with a check")


@gptzoo.hookimpl
def register_samplers(register):
    register("checked", CheckedSampler, doc="a sampler with a check")
"""

BROKEN_CHECKS = {
    "raises": ("staticmethod(lambda **params: 1 / 0)", "ZeroDivisionError: division by zero"),
    "returns-none": ("staticmethod(lambda **params: None)", "it returned None, not a list of str"),
    "returns-str": ("staticmethod(lambda **params: 'eps is bad')", "it returned 'eps is bad', not a list of str"),
    "returns-non-str": ("staticmethod(lambda **params: ['fine', 42])", "it returned a list holding 42, not only str"),
    "not-callable": ("42", "it is 42, not a function"),
    "claims-to-be-str": (
        "staticmethod(lambda **params: [type('Liar', (), {'__class__': property(lambda self: str)})()])",
        "it returned a list holding an object of type Liar, not only str",
    ),
    "wrong-signature": (
        "staticmethod(lambda: [])",
        "TypeError: {cls}.<lambda>() got an unexpected keyword argument '{arg}'",
    ),
    "sys-exit": ("staticmethod(lambda **params: __import__('sys').exit(2))", "called sys.exit(2)"),
    "os-exit": ("staticmethod(lambda **params: __import__('os')._exit(6))", "called os._exit(6)"),
}
CHECKED_RECIPE = {"norm": "model.norm=checked", "sampler": 'generate.samplers=[{ name = "checked", p = 0.25 }]'}
CHECKED_ARG = {"norm": ("CheckedNorm", "dim"), "sampler": ("CheckedSampler", "p")}
"""The class of each kind's checked component and the first argument its check receives."""


@pytest.mark.parametrize("kind", CHECKED_RECIPE)
@pytest.mark.parametrize("case", BROKEN_CHECKS)
def test_a_broken_check_is_a_plugin_error(
    site: FakeSite, no_real_exit: object, capsys: pytest.CaptureFixture[str], case: str, kind: str
) -> None:
    check, what = BROKEN_CHECKS[case]
    site.add("check", "gptzoo_fake_check", CHECKED.format(check=check))
    cls, arg = CHECKED_ARG[kind]
    what = what.format(cls=cls, arg=arg)
    message = (
        f"{kind} 'checked' from gptzoo_fake_check (gptzoo-fake-check 1.0) has a broken check: {what}; "
        f"fix the plugin, or choose another {kind}"
    )
    with pytest.raises(gptzoo.PluginError) as excinfo:
        load_recipe("gpt2-tiny", [CHECKED_RECIPE[kind]])
    assert str(excinfo.value) == message
    assert os._exit is no_real_exit
    if kind == "sampler":
        with pytest.raises(gptzoo.PluginError) as excinfo:
            SamplerChain.from_registry(gptzoo.get_registry(), [("checked", {"p": 0.25})])
        assert str(excinfo.value) == message
    from cli_run import run_error

    assert run_error(capsys, "build", "gpt2-tiny", "--set", CHECKED_RECIPE[kind]) == f"error: {message}"


@pytest.mark.parametrize("kind", CHECKED_RECIPE)
def test_a_check_may_return_a_tuple_of_problems(site: FakeSite, kind: str) -> None:
    site.add("check", "gptzoo_fake_check", CHECKED.format(check="staticmethod(lambda **params: ('too odd',))"))
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        load_recipe("gpt2-tiny", [CHECKED_RECIPE[kind]])
    where = "[model] norm" if kind == "norm" else "[generate] samplers[0]"
    assert excinfo.value.problems == [f"{where} (checked): too odd"]


STR_SUBCLASS = (
    "staticmethod(lambda **params: [type('Loud', (str,), dict.fromkeys(('__format__', '__str__', '__repr__'), "
    "lambda *args: 1 / 0))('too odd')])"
)
"""A check whose problem is a str subclass that cannot be formatted, printed or shown."""


@pytest.mark.parametrize("kind", CHECKED_RECIPE)
def test_a_checks_problems_are_kept_as_plain_text(
    site: FakeSite, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    site.add("check", "gptzoo_fake_check", CHECKED.format(check=STR_SUBCLASS))
    entry = gptzoo.get_registry().get(kind, "checked")
    problems = plugin_code.check(entry, {"dim": 8} if kind == "norm" else {"p": 0.25})
    assert problems == ["too odd"] and type(problems[0]) is str
    where = "[model] norm" if kind == "norm" else "[generate] samplers[0]"
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        load_recipe("gpt2-tiny", [CHECKED_RECIPE[kind]])
    assert excinfo.value.problems == [f"{where} (checked): too odd"]
    if kind == "sampler":
        with pytest.raises(gptzoo.GptzooError) as excinfo:
            SamplerChain.from_registry(gptzoo.get_registry(), [("checked", {"p": 0.25})])
        assert str(excinfo.value) == "sampler 'checked': too odd"
    from cli_run import run_error

    message = run_error(capsys, "build", "gpt2-tiny", "--set", CHECKED_RECIPE[kind])
    assert message.endswith(f"{where} (checked): too odd")


# --- samplers are held to their contract like model components -----------------------------------------------


def sampler_plugin(name: str, factory: str) -> str:
    """A plugin registering sampler ``name``, built by the function ``factory`` that ``factory`` defines."""
    return f"""
{factory}

@gptzoo.hookimpl
def register_samplers(register):
    register({name!r}, factory, doc="a sampler that misbehaves")
"""


CONTRACT_TAIL = (
    ", which the sampler contract requires (gptzoo.hookspecs.CONTRACTS, interface gptzoo.interfaces.Sampler); "
    "fix the plugin, or choose another sampler"
)
BROKEN_SAMPLERS = {
    "raises": (
        "def factory():\n    raise RuntimeError('boom')",
        " failed to build: RuntimeError: boom; fix the plugin, or choose another sampler",
    ),
    "plain-function": (
        "def factory():\n    return lambda logits, input_ids: logits",
        " built a function without picks, pick" + CONTRACT_TAIL,
    ),
    "object": ("factory = object", " built an object without __call__, picks, pick" + CONTRACT_TAIL),
    "picks-a-tensor": (
        "import torch\nfrom gptzoo.interfaces import Sampler\n\n\nclass Ambiguous(Sampler):\n"
        "    picks = torch.tensor([True, False])\n\n\nfactory = Ambiguous",
        " built an Ambiguous: its picks is a Tensor, the sampler contract says bool (gptzoo.interfaces.Sampler); "
        "fix the plugin, or choose another sampler",
    ),
    "picks-unbooleable": (
        "from gptzoo.interfaces import Sampler\n\n\nclass Unbooleable:\n    def __bool__(self):\n"
        "        raise RuntimeError('no truth')\n\n\nclass Stubborn(Sampler):\n    picks = Unbooleable()\n\n\n"
        "factory = Stubborn",
        " built a Stubborn: its picks is an Unbooleable, the sampler contract says bool (gptzoo.interfaces.Sampler); "
        "fix the plugin, or choose another sampler",
    ),
    "pick-not-callable": (
        "from gptzoo.interfaces import Sampler\n\n\nclass Greedyish(Sampler):\n    picks = True\n"
        "    pick = 'argmax'\n\n\nfactory = Greedyish",
        " built a Greedyish: its pick is 'argmax', the sampler contract says a method (gptzoo.interfaces.Sampler); "
        "fix the plugin, or choose another sampler",
    ),
    "gptzoo-error": (
        "def factory():\n    raise gptzoo.GptzooError('broken needs a GPU; generate with --device cuda')",
        ": broken needs a GPU; generate with --device cuda",
    ),
    "sys-exit": (
        "def factory():\n    import sys; sys.exit(3)",
        " failed to build: called sys.exit(3); fix the plugin, or choose another sampler",
    ),
    "os-exit": (
        "def factory():\n    import os; os._exit(4)",
        " failed to build: called os._exit(4); fix the plugin, or choose another sampler",
    ),
}


@pytest.mark.parametrize("case", BROKEN_SAMPLERS)
def test_a_broken_sampler_is_a_plugin_error(
    site: FakeSite, no_real_exit: object, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    factory, what = BROKEN_SAMPLERS[case]
    site.add("sampler", "gptzoo_fake_sampler", sampler_plugin("broken", factory))
    message = f"sampler 'broken' from gptzoo_fake_sampler (gptzoo-fake-sampler 1.0){what}"
    with pytest.raises(gptzoo.PluginError) as excinfo:
        load_recipe("gpt2-tiny", ['generate.samplers=["broken"]'])
    assert str(excinfo.value) == message
    with pytest.raises(gptzoo.PluginError) as excinfo:
        SamplerChain.from_registry(gptzoo.get_registry(), [("broken", {})])
    assert str(excinfo.value) == message
    assert os._exit is no_real_exit
    from cli_run import run_error

    argv = ("generate", "gpt2-tiny", "--set", 'generate.samplers=["broken"]', "--prompt", "a")
    assert run_error(capsys, *argv) == f"error: {message}"


def test_a_sampler_check_judges_the_command_line_flags(site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    """--top-k names the top_k step: a plugin that overrides it has its check run on the flag's value."""
    site.add(
        "evenk",
        "gptzoo_fake_evenk",
        """
from gptzoo.interfaces import Sampler, SamplerFlag


class EvenTopK(Sampler):
    flag = SamplerFlag("k", 30, "keep this many most likely tokens (an even number)", int)
    check = staticmethod(lambda *, k=50: [] if k % 2 == 0 else [f"k must be even, got {k}"])

    def __init__(self, k=50):
        self.k = k


@gptzoo.hookimpl
def register_samplers(register):
    register("top_k", EvenTopK, override=True)
""",
    )
    from cli_run import run_error

    assert run_error(capsys, "generate", "gpt2-tiny", "--prompt", "a", "--top-k", "5") == (
        "error: sampler 'top_k': k must be even, got 5 (sampler 'top_k' is overridden by gptzoo_fake_evenk "
        "(gptzoo-fake-evenk 1.0))"
    )


# --- a plugin that overrides a component a shipped recipe names -----------------------------------------------

WITHOUT_PARAMETERS = """
from torch import nn
from gptzoo.interfaces import Sampler


class BareNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        return x


class BareSampler(Sampler):
    def __init__(self):
        pass


@gptzoo.hookimpl
def register_norms(register):
    register({norm!r}, BareNorm, override=True)


@gptzoo.hookimpl
def register_samplers(register):
    register({sampler!r}, BareSampler, override=True)
"""


def test_an_override_that_breaks_a_shipped_recipe_is_named(site: FakeSite) -> None:
    """The shipped recipe is not at fault: each of its parameter problems names the overriding plugin."""
    shipped = load_recipe("shakespeare-bytes")
    norm, step = shipped.model.norm, shipped.generate.samplers[0]
    assert norm.kwargs and step.kwargs
    site.add("override", "gptzoo_fake_override", WITHOUT_PARAMETERS.format(norm=norm.name, sampler=step.name))
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        load_recipe("shakespeare-bytes", registry=gptzoo.get_registry())  # the default one predates the plugin
    by = "is overridden by gptzoo_fake_override (gptzoo-fake-override 1.0)"
    assert excinfo.value.problems == [
        *(
            f"[model] norm.{p}: norm {norm.name!r} has no parameter {p!r} (it takes none) (norm {norm.name!r} {by})"
            for p in norm.kwargs
        ),
        *(
            f"[generate] samplers[0].{p}: sampler {step.name!r} has no parameter {p!r} (it takes none) "
            f"(sampler {step.name!r} {by})"
            for p in step.kwargs
        ),
    ]


# --- a factory's parameters -----------------------------------------------------------------------------------

PARAMETERS = """
from torch import nn


class Refusing(type):
    def __instancecheck__(cls, obj):
        raise RuntimeError("instancecheck boom")


class Unhashable(type):
    def __hash__(cls):
        raise RuntimeError("hash boom")

    __eq__ = type.__eq__


class Norm(nn.Module):
    def __init__(self, dim, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return x


def with_default(default):
    def factory(dim, *, eps=1e-5, opt=default):
        return Norm(dim)

    return factory


@gptzoo.hookimpl
def register_norms(register):
    register("refusing", with_default(Refusing("Odd", (), {})()), doc="a default whose class refuses isinstance")
    register("unhashable", with_default(Unhashable("Odd", (), {})()), doc="a default whose class cannot be hashed")
    register("anything", Norm, doc="takes **kwargs")
"""


@pytest.mark.parametrize(("name", "raised"), [("refusing", "instancecheck boom"), ("unhashable", "hash boom")])
def test_a_default_of_an_exotic_type_is_a_plugin_error(
    site: FakeSite, capsys: pytest.CaptureFixture[str], name: str, raised: str
) -> None:
    site.add("parameters", "gptzoo_fake_parameters", PARAMETERS)
    override = f'model.norm={{ name = "{name}", opt = 1 }}'
    message = (
        f"norm {name!r} from gptzoo_fake_parameters (gptzoo-fake-parameters 1.0) has a parameter 'opt' whose default "
        f"cannot be inspected: RuntimeError: {raised}; fix the plugin, or choose another norm"
    )
    with pytest.raises(gptzoo.PluginError) as excinfo:
        load_recipe("gpt2-tiny", [override])
    assert str(excinfo.value) == message
    from cli_run import run_error

    assert run_error(capsys, "build", "gpt2-tiny", "--set", override) == f"error: {message}"
    assert load_recipe("gpt2-tiny", [f"model.norm={name}"]).model.norm.name == name  # not given: never inspected


def test_a_factory_taking_kwargs_accepts_any_parameter(site: FakeSite) -> None:
    """Passed through unchecked against the signature; still plain finite values, and never one the model passes."""
    site.add("parameters", "gptzoo_fake_parameters", PARAMETERS)
    recipe = load_recipe("gpt2-tiny", ['model.norm={ name = "anything", eps = 1e-3, label = "x" }'])
    model = build_model(recipe, device="meta")
    assert model.blocks[0].ln_1.kwargs == {"eps": 1e-3, "label": "x"}
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        load_recipe("gpt2-tiny", ['model.norm={ name = "anything", eps = nan, dim = 3 }'])
    assert excinfo.value.problems == [
        "[model] norm.eps must be a finite number, got nan",
        "[model] norm.dim: norm 'anything' has no parameter 'dim'; the model passes it: set [model] n_embd",
    ]

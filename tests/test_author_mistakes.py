"""A plugin author's mistakes, each met at ``gptzoo build`` (before anything is written): one message
naming the distribution, the component and what to change; exit 2; no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import run_error
from fakedist import BROKEN, FakeSite
from test_plugins import report

import gptzoo

ATTENTION = """
import torch
from torch import nn
from gptzoo_plugins._attentions import CausalSelfAttention


class NoCache(nn.Module):
    def __init__(self, d_model, n_head, *, n_kv_head, head_dim, bias):
        super().__init__()
        self.c_proj = nn.Linear(d_model, d_model)

    def flops(self, batch, seq_len):
        return {}

    def forward(self, x, ctx, cache=None):
        return self.c_proj(x)


class XOnly(CausalSelfAttention):
    def forward(self, x):
        return x


class Windowed(CausalSelfAttention):
    def __init__(self, d_model, n_head, *, n_kv_head, head_dim, bias, window=4):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        super().__init__(d_model, n_head, n_kv_head=n_kv_head, head_dim=head_dim, bias=bias)


class NoDim(nn.Module):
    def __init__(self, *, eps=1e-5):
        super().__init__()

    def forward(self, x):
        return x


@gptzoo.hookimpl
def register_norms(register):
    register("nodim", NoDim, doc="does not take dim")


@gptzoo.hookimpl
def register_attentions(register):
    register("nocache", NoCache, doc="no init_cache, no kv_bytes")
    register("xonly", XOnly, doc="forward(x)")
    register("windowed", Windowed, doc="refuses a window below 1")
"""

SAMPLER = """
@gptzoo.hookimpl
def register_samplers(register):
    register("nopick", lambda: (lambda logits, input_ids: logits), doc="a plain function")
"""

FROM = "from gptzoo_fake_mistakes (gptzoo-fake-mistakes 1.0)"
FIX = "fix the plugin, or choose another"
CONTRACT = "which the {kind} contract requires (gptzoo.hookspecs.CONTRACTS, interface gptzoo.interfaces.{interface})"
CASES = {
    "wrong-signature": (
        "model.norm=nodim",
        f"norm 'nodim' {FROM} has a factory that does not take dim by keyword, which the model passes to every norm "
        "(gptzoo.hookspecs.register_norms); add it to the factory's parameters, or choose another norm",
    ),
    "missing-members": (
        'model.attention="nocache"',
        f"attention 'nocache' {FROM} built a NoCache without init_cache, kv_bytes, "
        + CONTRACT.format(kind="attention", interface="Attention")
        + f"; {FIX} attention",
    ),
    "forward-without-context": (
        'model.attention="xonly"',
        f"attention 'xonly' {FROM} built a XOnly whose forward(x) cannot take (x, ctx, cache), which the model passes "
        f"it (gptzoo.hookspecs.register_attentions); {FIX} attention",
    ),
    "value-error": (
        'model.attention={ name = "windowed", window = 0 }',
        f"attention 'windowed' {FROM} refused window = 0: window must be at least 1, got 0; change that parameter, or "
        "choose another attention",
    ),
    "sampler-without-picks": (
        'generate.samplers=["nopick"]',
        f"sampler 'nopick' {FROM} built a function without picks, pick, "
        + CONTRACT.format(kind="sampler", interface="Sampler")
        + f"; {FIX} sampler",
    ),
}


@pytest.fixture
def site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    for var in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "GPTZOO_PLUGIN_WARN_S"):
        monkeypatch.delenv(var, raising=False)
    return fake_site


@pytest.mark.parametrize("case", CASES)
def test_a_contract_mistake_is_one_message_at_build(
    site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    site.add("mistakes", "gptzoo_fake_mistakes", ATTENTION + SAMPLER)
    override, message = CASES[case]
    out = tmp_path / "out"
    assert run_error(capsys, "build", "gpt2-tiny", "--set", override) == f"error: {message}"
    assert run_error(capsys, "build", "gpt2-tiny", "--set", override, "--out", str(out)) == f"error: {message}"
    assert not out.exists()


NO_DEFAULT = """
from torch import nn


class NoDefault(nn.Module):
    def __init__(self, dim, *, alpha):
        super().__init__()

    def forward(self, x):
        return x


@gptzoo.hookimpl
def register_norms(register):
    register("nodefault", NoDefault, doc="alpha has no default")
"""
NO_DEFAULT_ERROR = (
    "gptzoo_fake_nodefault (gptzoo-fake-nodefault 1.0) registered norm 'nodefault' with a factory whose parameter "
    "'alpha' has no default; give every parameter a default (a recipe may leave any out, and the model passes only "
    "dim)"
)


def test_a_parameter_without_a_default_fails_the_plugin_and_using_it_says_so(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.add("nodefault", "gptzoo_fake_nodefault", NO_DEFAULT)
    info = report(gptzoo.get_registry(), "nodefault")
    assert (info.status, info.error) == ("failed", NO_DEFAULT_ERROR)
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=nodefault") == (
        f"warning: plugin 'nodefault' (gptzoo-fake-nodefault 1.0) failed: {NO_DEFAULT_ERROR}; see `gptzoo plugins` "
        "error: --set model.norm=nodefault: [model] norm: norm 'nodefault' would come from gptzoo-fake-nodefault 1.0, "
        f"which failed to load: {NO_DEFAULT_ERROR}; fix or uninstall it (see `gptzoo plugins`)"
    )
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=gptzoo-fake-nodefault:nodefault").endswith(
        "[model] norm: norm 'gptzoo-fake-nodefault:nodefault' would come from gptzoo-fake-nodefault 1.0, which failed "
        f"to load: {NO_DEFAULT_ERROR}; fix or uninstall it (see `gptzoo plugins`)"
    )


@pytest.mark.parametrize(
    ("factory", "required"),
    [("lambda *, k: None", "parameter 'k' has"), ("lambda a, /, *args, b, **kw: None", "parameters 'a', 'b' have")],
)
def test_every_parameter_without_a_default_is_named(site: FakeSite, factory: str, required: str) -> None:
    site.add(
        "req", "gptzoo_fake_req", f"@gptzoo.hookimpl\ndef register_samplers(register):\n    register('s', {factory})\n"
    )
    assert report(gptzoo.get_registry(), "req").error == (
        f"gptzoo_fake_req (gptzoo-fake-req 1.0) registered sampler 's' with a factory whose {required} no default; "
        "give every parameter a default (a recipe may leave any out, and the model passes nothing)"
    )


def test_an_unknown_name_mentions_the_plugins_that_failed_to_load(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.add("broken", "gptzoo_fake_broken", BROKEN)
    available = ", ".join(gptzoo.get_registry().available("norm"))
    message = run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=dyt")
    assert message.endswith(
        f"error: --set model.norm=dyt: [model] norm: unknown norm 'dyt' (available: {available}); plugins that failed "
        "to load, which may register it: gptzoo-fake-broken 1.0 (see `gptzoo plugins`)"
    )


def test_a_name_staged_before_a_registration_failure_names_the_failed_plugin(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.add(
        "halfway",
        "gptzoo_fake_halfway",
        "@gptzoo.hookimpl\ndef register_norms(register):\n    register('dyt', object)\n    raise OSError('no GPU')\n",
    )
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=dyt").endswith(
        "error: --set model.norm=dyt: [model] norm: norm 'dyt' would come from gptzoo-fake-halfway 1.0, which failed "
        "to load: OSError: no GPU; fix or uninstall it (see `gptzoo plugins`)"
    )

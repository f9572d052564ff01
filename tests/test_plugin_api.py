"""The stable plugin API: the contract's version, plugins written against an older form of a member
(adapted with one warning, or refused with a PluginError), a bare name that a built-in keeps while a
plugin registers it too (one warning naming both), and a checkpoint's [provenance] deciding which
implementation loads it."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from fakedist import RING_WINDOW, FakeSite, rmsnorm_replacement

import gptzoo
from gptzoo.errors import GptzooWarning, PluginError, RecipeError
from gptzoo.hookspecs import CONTRACT_VERSION
from gptzoo.moves import MOVES, Move, move_message
from gptzoo.plugin_manager import gptzoo_version

REPO = Path(__file__).resolve().parents[1]
VERSION = gptzoo_version()

OLD_MLP = '''
from torch import nn

from gptzoo.flops import linear_flops


class OldDenseMLP(nn.Module):
    """A dense MLP written against the previous release's contract: flops(seq_len)."""

    def __init__(self, d_model, d_ff, *, activation, bias):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))

    def flops(self, seq_len):
        return {"mlp": linear_flops(seq_len, self.c_fc, self.c_proj)}


@gptzoo.hookimpl
def register_mlps(register):
    register("old_dense", OldDenseMLP)
'''
"""A plugin of the previous release (contract 1, which no plugin declared): its MLP's ``flops(seq_len)``."""

OLD_MLP_CULPRIT = "mlp 'old_dense' from gptzoo_fake_oldmlp (gptzoo-fake-oldmlp 1.0)"
ADAPTED = (
    f"{OLD_MLP_CULPRIT} implements flops(seq_len), the form before plugin contract 2, which calls "
    "flops(batch, seq_len); gptzoo adapts it as batch * flops(seq_len) for now: count the FLOPs of batch sequences "
    f"of seq_len tokens in def flops(self, batch, seq_len), and declare gptzoo_contract = {CONTRACT_VERSION} in the "
    "plugin"
)
SLIDING_PLUGIN = RING_WINDOW.replace('register("ring_window"', 'register("sliding_window"')
"""A plugin whose attention has the name of a built-in added later."""


def run_gptzoo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gptzoo", *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )


def words(text: str) -> str:
    return " ".join(text.split())


def gptzoo_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, GptzooWarning)]


# --- the contract's version -----------------------------------------------------------------------


def test_contract_version_is_public() -> None:
    assert gptzoo.CONTRACT_VERSION == CONTRACT_VERSION == 8


def test_a_plugin_declaring_a_newer_contract_is_refused_at_load(fake_site: FakeSite) -> None:
    fake_site.add("future", "gptzoo_fake_future", "gptzoo_contract = 9\n" + OLD_MLP.replace("old_dense", "future"))
    message = (
        f"it is written for gptzoo plugin contract 9 (gptzoo_contract = 9), and gptzoo {VERSION} supports contracts "
        "up to 8; upgrade gptzoo (pip install -U gptzoo), or install a release of gptzoo-fake-future written for "
        "contract 8"
    )
    registry = gptzoo.get_registry()
    (info,) = [p for p in registry.plugins if p.name == "future"]
    assert (info.status, info.error) == ("failed", message)
    with pytest.raises(PluginError) as raised:
        gptzoo.get_registry(strict=True)
    assert str(raised.value) == (
        f"plugin 'future' (gptzoo-fake-future 1.0) failed to load: {message}; fix or uninstall it, or leave strict "
        "mode (strict=True or GPTZOO_STRICT_PLUGINS) to skip it"
    )


@pytest.mark.parametrize("declared", ["0", "True", "'2'"])
def test_a_contract_declaration_that_is_no_version_is_refused(fake_site: FakeSite, declared: str) -> None:
    fake_site.add("odd", "gptzoo_fake_odd", f"gptzoo_contract = {declared}\n")
    (info,) = [p for p in gptzoo.get_registry().plugins if p.name == "odd"]
    assert info.error == (
        f"its gptzoo_contract is {declared}, not a contract version; set "
        "gptzoo_contract = 8, the version it is written for"
    )


@pytest.mark.parametrize("declared", [2, 3, 4, 5, 6, 7, 8])
def test_a_declared_contract_is_recorded_and_one_written_for_version_2_still_loads(
    fake_site: FakeSite, declared: int
) -> None:
    source = f"gptzoo_contract = {declared}\n" + OLD_MLP.replace("old_dense", "cur")
    fake_site.add("current", "gptzoo_fake_current", source)
    registry = gptzoo.get_registry(strict=True)
    (info,) = [p for p in registry.plugins if p.name == "current"]
    assert info.contract == declared and registry.get("mlp", "cur").contract == declared
    assert registry.get("mlp", "dense").contract == CONTRACT_VERSION


# --- older forms of members -----------------------------------------------------------------------


def test_an_old_flops_is_adapted_with_one_warning(fake_site: FakeSite) -> None:
    fake_site.add("oldmlp", "gptzoo_fake_oldmlp", OLD_MLP)
    registry = gptzoo.get_registry(strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = gptzoo.build_model(
            gptzoo.load_recipe("gpt2-tiny", ["model.mlp=old_dense"], registry=registry), registry=registry
        )
    assert gptzoo_warnings(caught) == [ADAPTED]
    reference = gptzoo.build_model("gpt2-tiny", device="meta", registry=registry)
    assert model.blocks[1].mlp.flops(3, 7) == reference.blocks[1].mlp.flops(3, 7) == {"mlp": 3 * 7 * 2 * 2 * 64 * 256}


def test_cli_build_with_an_old_flops_plugin_exits_0_with_the_new_forms_flops(tmp_path: Path) -> None:
    site = FakeSite(tmp_path / "site")
    site.add("oldmlp", "gptzoo_fake_oldmlp", OLD_MLP)
    args = ("build", "gpt2-tiny", "--batch", "3", "--seq-len", "16", "--json")
    old = run_gptzoo(*args, "--set", "model.mlp=old_dense", env=site.env())
    assert old.returncode == 0, old.stderr
    assert "Traceback" not in old.stderr
    assert words(old.stderr).count(words(ADAPTED)) == 1
    new = run_gptzoo(*args, env=site.env())
    assert new.returncode == 0, new.stderr
    assert json.loads(old.stdout)["flops"] == json.loads(new.stdout)["flops"]


def test_an_old_flops_in_a_plugin_declaring_contract_2_is_refused(fake_site: FakeSite) -> None:
    fake_site.add("liar", "gptzoo_fake_liar", "gptzoo_contract = 2\n" + OLD_MLP)
    registry = gptzoo.get_registry(strict=True)
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.mlp=old_dense"], registry=registry)
    with pytest.raises(PluginError) as raised:
        gptzoo.build_model(recipe, device="meta", registry=registry)
    assert str(raised.value) == (
        "mlp 'old_dense' from gptzoo_fake_liar (gptzoo-fake-liar 1.0) declares plugin contract 2 (gptzoo_contract = 2) "
        "but implements flops(seq_len), the form before contract 2, which calls flops(batch, seq_len); fix the plugin "
        "(count the FLOPs of batch sequences of seq_len tokens in def flops(self, batch, seq_len), and declare "
        "gptzoo_contract = 8), or choose another mlp"
    )


def test_cli_build_refusing_an_old_form_is_one_error_line(tmp_path: Path) -> None:
    site = FakeSite(tmp_path / "site")
    site.add("liar", "gptzoo_fake_liar", "gptzoo_contract = 2\n" + OLD_MLP)
    proc = run_gptzoo("build", "gpt2-tiny", "--set", "model.mlp=old_dense", env=site.env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: mlp 'old_dense' from gptzoo_fake_liar (gptzoo-fake-liar 1.0) declares ")


# --- a bare name a built-in keeps while a plugin registers it too ---------------------------------

SHADOWED = (
    f"[model] attention: attention 'sliding_window' is the built-in one (gptzoo {VERSION}), and gptzoo-fake-sliding "
    "1.0 registers attention 'sliding_window' too; write 'gptzoo-fake-sliding:sliding_window' for the plugin's, or "
    "'gptzoo:sliding_window' for the built-in without this warning"
)


def test_a_bare_name_a_builtin_keeps_warns_once_naming_both(fake_site: FakeSite) -> None:
    fake_site.add("sliding", "gptzoo_fake_sliding", SLIDING_PLUGIN)
    registry = gptzoo.get_registry(strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a command may validate a recipe more than once
            recipe = gptzoo.load_recipe("gpt2-tiny", ["model.attention=sliding_window"], registry=registry)
        model = gptzoo.build_model(recipe, device="meta", registry=registry)
    assert gptzoo_warnings(caught) == [SHADOWED]
    assert type(model.blocks[0].attn).__module__ == "gptzoo_plugins._attentions"
    for name in ("gptzoo:sliding_window", "gptzoo-fake-sliding:sliding_window", "causal"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gptzoo.load_recipe("gpt2-tiny", [f"model.attention={name}"], registry=registry)
        assert gptzoo_warnings(caught) == [], name


def test_cli_build_warns_once_about_a_shadowed_name(tmp_path: Path) -> None:
    site = FakeSite(tmp_path / "site")
    site.add("sliding", "gptzoo_fake_sliding", SLIDING_PLUGIN)
    proc = run_gptzoo("build", "gpt2-tiny", "--set", "model.attention=sliding_window", "--json", env=site.env())
    assert proc.returncode == 0, proc.stderr
    assert words(proc.stderr).count(words(SHADOWED)) == 1


def test_cli_generate_says_each_warning_once(tmp_path: Path) -> None:
    """generate validates the recipe, builds the model on the meta device and again for real: one warning each."""
    site = FakeSite(tmp_path / "site")
    site.add("sliding", "gptzoo_fake_sliding", SLIDING_PLUGIN)
    site.add("oldmlp", "gptzoo_fake_oldmlp", OLD_MLP)
    overrides = ("--set", "model.attention=sliding_window", "--set", "model.mlp=old_dense")
    proc = run_gptzoo("generate", "gpt2-tiny", "--prompt", "Hi", "--max-new-tokens", "2", *overrides, env=site.env())
    assert proc.returncode == 0, proc.stderr
    assert words(proc.stderr).count(words(SHADOWED)) == 1
    assert words(proc.stderr).count(words(ADAPTED)) == 1


# --- a checkpoint's [provenance] decides the implementation ---------------------------------------


def as_previous_release_wrote_it(checkpoint: Path, qualified: str, bare: str) -> None:
    """The checkpoint's recipe.toml naming the component bare, as a release wrote it before the name clashed."""
    recipe = checkpoint / "recipe.toml"
    text = recipe.read_text(encoding="utf-8")
    assert f'"{qualified}"' in text
    recipe.write_text(text.replace(f'"{qualified}"', f'"{bare}"'), encoding="utf-8")


def test_a_plugins_checkpoint_never_loads_the_builtin_of_the_same_name(fake_site: FakeSite, tmp_path: Path) -> None:
    fake_site.add("sliding", "gptzoo_fake_sliding", SLIDING_PLUGIN)
    registry = gptzoo.get_registry(strict=True)
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.attention=gptzoo-fake-sliding:sliding_window"], registry=registry)
    checkpoint = gptzoo.save_checkpoint(gptzoo.build_model(recipe, registry=registry), recipe, tmp_path / "ckpt")
    assert 'attention = "gptzoo-fake-sliding 1.0"' in (checkpoint / "recipe.toml").read_text(encoding="utf-8")
    as_previous_release_wrote_it(checkpoint, "gptzoo-fake-sliding:sliding_window", "sliding_window")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = gptzoo.load_checkpoint(checkpoint, registry=registry)
    assert gptzoo_warnings(caught) == []
    assert type(model.blocks[0].attn).__name__ == "RingWindowAttention"
    assert model.recipe.model.attention.name == "gptzoo-fake-sliding:sliding_window"
    with pytest.raises(RecipeError) as raised:
        gptzoo.load_checkpoint(checkpoint, registry=gptzoo.get_registry(third_party=False))
    assert str(raised.value) == (
        f"{checkpoint / 'recipe.toml'}: [model] attention: attention 'sliding_window' came from gptzoo-fake-sliding "
        f"1.0 (not the attention of that name from gptzoo {VERSION}, a different implementation), which is not "
        "installed: pip install gptzoo-fake-sliding"
    )


def test_a_builtins_checkpoint_never_loads_a_plugin_that_overrides_the_name(
    fake_site: FakeSite, tmp_path: Path
) -> None:
    builtin_only = gptzoo.get_registry(third_party=False)
    recipe = gptzoo.load_recipe("llama-tiny", registry=builtin_only)  # norm = { name = "rmsnorm", eps = 1e-5 }
    checkpoint = gptzoo.save_checkpoint(gptzoo.build_model(recipe, registry=builtin_only), recipe, tmp_path / "ckpt")
    fake_site.add("override", "gptzoo_fake_override", rmsnorm_replacement(override=True))
    registry = gptzoo.get_registry(strict=True)
    assert type(gptzoo.build_model("llama-tiny", device="meta", registry=registry).ln_f).__name__ == "MyRMSNorm"
    model = gptzoo.load_checkpoint(checkpoint, registry=registry)
    assert type(model.ln_f).__name__ == "RMSNorm" and model.recipe.model.norm.name == "gptzoo:rmsnorm"


def test_a_checkpoint_whose_recorded_distribution_is_missing_names_it(fake_site: FakeSite, tmp_path: Path) -> None:
    fake_site.add("sliding", "gptzoo_fake_sliding", SLIDING_PLUGIN)
    registry = gptzoo.get_registry(strict=True)
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.attention=gptzoo-fake-sliding:sliding_window"], registry=registry)
    checkpoint = gptzoo.save_checkpoint(gptzoo.build_model(recipe, registry=registry), recipe, tmp_path / "ckpt")
    builtin_only = gptzoo.get_registry(third_party=False)
    with pytest.raises(RecipeError, match=re.escape("which is not installed: pip install gptzoo-fake-sliding")):
        gptzoo.load_checkpoint(checkpoint, registry=builtin_only)


MOVED = [
    ("KVCache", "gptzoo.model.kv_cache"),
    ("TensorMap", "gptzoo.hf.tensor_map"),
    ("DecodePlan", "gptzoo.inference.plan"),
    ("Buffer", "gptzoo.inference.plan"),
    ("PositionStep", "gptzoo.inference.plan"),
]


@pytest.mark.parametrize(("name", "home"), MOVED)
def test_a_name_moved_out_of_interfaces_imports_from_the_old_path_with_one_warning(name: str, home: str) -> None:
    import importlib

    from gptzoo import interfaces

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = getattr(interfaces, name)
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            GptzooWarning,
            f"gptzoo.interfaces.{name} moved to {home}.{name}; import it from there (from {home} import {name}): "
            "the old path works for now, with this warning",
        )
    ]
    assert caught[0].filename == __file__  # the warning points at the import, not at gptzoo
    assert old is getattr(importlib.import_module(home), name)


def test_the_moves_are_the_compat_table_and_interfaces_keeps_only_the_contract() -> None:
    from gptzoo import interfaces

    assert [(m.name, m.old, m.new, m.version) for m in MOVES if m.old == "gptzoo.interfaces"] == [
        (name, "gptzoo.interfaces", home, 2) for name, home in MOVED
    ]
    assert not {name for name, _ in MOVED} & set(vars(interfaces))
    with pytest.raises(AttributeError, match="^module 'gptzoo.interfaces' has no attribute 'Nothing'$"):
        interfaces.Nothing  # noqa: B018


@pytest.mark.parametrize("move", [pytest.param(m, id=f"{m.old}.{m.name}") for m in MOVES])
def test_every_moved_name_reaches_its_new_home_from_the_old_with_one_warning(move: Move) -> None:
    old, new = importlib.import_module(move.old), importlib.import_module(move.new)
    assert move.name not in vars(old) and move.name in vars(new)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert getattr(old, move.name) is getattr(new, move.name)
    assert gptzoo_warnings(caught) == [move_message(move)]


def test_a_contract_2_attention_without_contract_3s_members_loads_and_gets_the_derived_decode_cost(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_run import run_json

    fake_site.add("ring", "gptzoo_fake_ring", "gptzoo_contract = 2\n" + RING_WINDOW)
    registry = gptzoo.get_registry(strict=True)
    assert registry.get("attention", "ring_window").contract == 2
    overrides = ["model.attention=ring_window"]
    s = run_json(capsys, "build", "gpt2-tiny", "--set", overrides[0])
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", overrides), device="meta")
    attn, length, n_layer = model.blocks[0].attn, s["decode"]["cache_len"], len(model.blocks)
    assert not any(hasattr(attn, m) for m in ("decode_cost", "active_parameters", "aux_losses"))
    cached = attn.kv_bytes(1, length, torch.float32)
    assert cached == 2 * attn.n_kv_head * attn.window * attn.head_dim * 4  # the window, not the context
    # derived: a forward over one token, one multiply-add per cached value; its weights and its cache read
    flops = sum(attn.flops(1, 1).values()) + 2 * cached // 4
    weights = sum(p.numel() for p in attn.parameters()) * 4
    assert s["decode"]["by_component"]["attention"] == {
        "flops": n_layer * flops,
        "bytes": {"float32": n_layer * (weights + cached), "bfloat16": n_layer * (weights + cached) // 2},
    }
    assert s["params"]["active"] == s["params"]["total"]

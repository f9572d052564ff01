"""Hugging Face export follows each component's layout: a plugin norm whose Llama layout is registered
through register_hf_layouts (or, from the contract before version 2, given by its own hf_weights and
hf_config methods) exports, loads in transformers with the same logits, and imports back; components
without an equivalent, disagreeing or missing config fields are refused by name."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_error
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import PluginError
from gptzoo.hf import FAMILIES, NoEquivalentError, export_hf, load_hf

transformers.utils.logging.set_verbosity_error()

PLUGIN = '''
import torch
from torch import nn

import gptzoo
from gptzoo.hf.tensor_map import TensorMap


class RMS(nn.Module):
    """RMSNorm written anew: x / sqrt(mean(x^2) + epsilon) * scale, in float32."""

    def __init__(self, dim: int, *, epsilon: float = 1e-5) -> None:
        super().__init__()
        self.epsilon = epsilon
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        return self.scale * (h * (h.square().mean(-1, keepdim=True) + self.epsilon).rsqrt()).to(x.dtype)


class ScaledRMS(RMS):
    """The norm with a Llama layout."""


class Unmapped(RMS):
    """The same norm without a layout."""


class Unconfigured(RMS):
    """The same norm, mapped, but owning no config field."""


class Greedy(RMS):
    """A norm whose config claims what is the activation's."""


class Broken(RMS):
    """A norm whose config returns a list."""


class Sizer(RMS):
    """A norm whose config sets a structural field."""


class OldForm(RMS):
    """A norm that answers for its layouts itself, as the plugin contract before version 2 had it."""

    def hf_weights(self, family):
        return [TensorMap("scale", ("weight",))] if family == "llama" else None

    def hf_config(self, family):
        return {"rms_norm_eps": self.epsilon} if family == "llama" else None


@gptzoo.hookimpl
def register_norms(register):
    register("scaled_rms", ScaledRMS)
    register("unmapped", Unmapped)
    register("unconfigured", Unconfigured)
    register("greedy_norm", Greedy)
    register("broken_config", Broken)
    register("sizer", Sizer)
    register("old_form", OldForm)


def weights(norm):
    return [TensorMap("scale", ("weight",))]


@gptzoo.hookimpl
def register_hf_layouts(register):
    register(ScaledRMS, "llama", weights=weights, config=lambda norm: {"rms_norm_eps": norm.epsilon})
    register(Unconfigured, "llama", weights=weights)
    register(Greedy, "llama", weights=weights, config=lambda norm: {"rms_norm_eps": norm.epsilon, "hidden_act": "relu"})
    register(Broken, "llama", weights=weights, config=lambda norm: ["rms_norm_eps"])
    register(Sizer, "llama", weights=weights, config=lambda norm: {"rms_norm_eps": norm.epsilon, "hidden_size": 3})
'''

WHO = "from gptzoo_fake_hfnorm (gptzoo-fake-hfnorm 1.0)"


@pytest.fixture
def registry(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> gptzoo.Registry:
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("hfnorm", "gptzoo_fake_hfnorm", PLUGIN)
    return gptzoo.get_registry()


def plugin_model(registry: gptzoo.Registry, norm: str, *overrides: str) -> gptzoo.GPT:
    recipe = gptzoo.load_recipe("llama-tiny", [f"model.norm={norm}", *overrides], registry=registry)
    torch.manual_seed(0)
    model = gptzoo.build_model(recipe, registry=registry).eval()
    with torch.no_grad():  # norm scales that are not ones, so that a misplaced one changes the logits
        for name, p in model.named_parameters():
            if name.endswith(".scale"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("norm", ["scaled_rms", "old_form"])
def test_a_plugin_norm_exports_to_llama_with_the_same_logits_and_imports_back(
    registry: gptzoo.Registry, tmp_path: Path, norm: str
) -> None:
    model = plugin_model(registry, norm, "model.norm.epsilon=1e-4")
    export_hf(model, tmp_path / "hf", registry=registry)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    theta = config.get("rope_theta", config.get("rope_parameters", {}).get("rope_theta"))  # transformers 4.x, 5.x
    assert (config["rms_norm_eps"], config["hidden_act"], theta) == (1e-4, "silu", 10000.0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, model.recipe.model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(idx)
        torch.testing.assert_close(hf(idx).logits, ours, rtol=0, atol=1e-4)
        back = load_hf(tmp_path / "hf", registry=registry).eval()  # the family's own rmsnorm
        assert back.recipe.model.norm.name == "rmsnorm" and back.recipe.model.norm.kwargs == {"eps": 1e-4}
        torch.testing.assert_close(back(idx), ours, rtol=0, atol=1e-5)
    assert torch.equal(back.blocks[1].ln_2.weight, model.blocks[1].ln_2.scale)


def test_export_through_the_command_line(registry: gptzoo.Registry, tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "hf"
    argv = ["build", "llama-tiny", "--set", "model.norm=scaled_rms", "--out", str(ckpt), "--json"]
    assert main(argv) == 0
    assert main(["export", str(ckpt), "--hf", str(out), "--json"]) == 0
    assert json.loads((out / "config.json").read_text())["rms_norm_eps"] == 1e-5


def _refusal(registry: gptzoo.Registry, tmp_path: Path, norm: str, *overrides: str) -> str:
    model = plugin_model(registry, norm, *overrides)
    with pytest.raises(NoEquivalentError) as excinfo:
        export_hf(model, tmp_path / "out", registry=registry)
    assert not (tmp_path / "out").exists()
    return str(excinfo.value)


def test_a_plugin_component_without_a_layout_is_refused_by_name(registry: gptzoo.Registry, tmp_path: Path) -> None:
    others = ", ".join(f.title for f in FAMILIES.values() if f.title != "Llama" and f.exports)
    assert _refusal(registry, tmp_path, "unmapped") == (
        "recipe 'llama-tiny' has no Hugging Face Llama equivalent: norm 'unmapped' (it has no 'llama' layout: "
        f"LlamaForCausalLM has no equivalent of it); {others} differ at least as much"
    )


def test_a_component_of_the_old_contract_warns_once_and_still_exports(
    registry: gptzoo.Registry, tmp_path: Path
) -> None:
    from gptzoo.hf import layouts

    layouts._warned.clear()
    model = plugin_model(registry, "old_form")
    with pytest.warns(gptzoo.GptzooWarning) as caught:
        export_hf(model, tmp_path / "a", registry=registry)
        export_hf(model, tmp_path / "b", registry=registry)
    assert [str(w.message) for w in caught] == [
        "gptzoo_fake_hfnorm:OldForm answers for its Hugging Face layouts with hf_weights/hf_config methods, the "
        "plugin contract before version 2; register them with the register_hf_layouts hook instead "
        "(docs/plugins.md, 'Hugging Face layouts')"
    ]
    assert json.loads((tmp_path / "b" / "config.json").read_text())["rms_norm_eps"] == 1e-5


@pytest.mark.parametrize(
    ("norm", "llama"),
    [
        ("unconfigured", "config.json needs rms_norm_eps, which the norm's 'llama' layout gives, and none does"),
        ("greedy_norm", "norm 'greedy_norm' sets hidden_act='relu', activation 'silu' sets hidden_act='silu'"),
    ],
)
def test_missing_and_disagreeing_config_fields_are_refused_by_name(
    registry: gptzoo.Registry, tmp_path: Path, norm: str, llama: str
) -> None:
    message = _refusal(registry, tmp_path, norm)
    assert message.startswith(f"recipe 'llama-tiny' has no Hugging Face Llama equivalent: {llama}; "), message


@pytest.mark.parametrize(
    ("norm", "problem"),
    [
        (
            "broken_config",
            "has a 'llama' layout whose config returned an object of type list, not a dict of config.json field names "
            "to numbers, text, booleans, None or objects of those",
        ),
        (
            "sizer",
            "has a 'llama' layout whose config sets hidden_size, which LlamaForCausalLM takes from the recipe's "
            "structure",
        ),
    ],
)
def test_a_broken_layout_config_names_its_plugin(
    registry: gptzoo.Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str], norm: str, problem: str
) -> None:
    model = plugin_model(registry, norm)
    with pytest.raises(PluginError) as excinfo:
        export_hf(model, tmp_path / "out", registry=registry)
    assert str(excinfo.value) == f"norm {norm!r} {WHO} {problem}; fix the plugin, or choose another norm"
    ckpt = tmp_path / "ckpt"
    assert main(["build", "llama-tiny", "--set", f"model.norm={norm}", "--out", str(ckpt), "--json"]) == 0
    capsys.readouterr()
    assert run_error(capsys, "export", str(ckpt), "--hf", str(tmp_path / "out")) == f"error: {excinfo.value}"
    assert not (tmp_path / "out").exists()


def _layouts_plugin(body: str) -> str:
    return f"""
import gptzoo
from gptzoo.hf.tensor_map import TensorMap


@gptzoo.hookimpl
def register_hf_layouts(register):
{body}
"""


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            "    register(3, 'llama', weights=lambda m: [])",
            "registered a Hugging Face layout for 3, which is neither a class nor a reference 'module:Class'; pass "
            "the component's class",
        ),
        (
            "    register('gptzoo_plugins._norms:RMSNorm', 'llama', weights='weight')",
            "registered a Hugging Face layout ('llama') whose weights is not callable: 'weight'; pass a function of "
            "the component",
        ),
        (
            "    register('m:C', 'llama', weights=lambda m: [])\n    register('m:C', 'llama', weights=lambda m: [])",
            "registers the Hugging Face 'llama' layout of m:C twice",
        ),
        (
            "    register('m:C', 'llama', weights=lambda m: [], children=(('q_norm', 'q.norm'),))",
            "registered a Hugging Face layout ('llama') whose children are not attribute names: an object of type "
            "tuple; pass a tuple of them, each a name or a pair (ours, theirs) of names",
        ),
    ],
)
def test_a_malformed_layout_registration_is_refused_alone(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, body: str, error: str
) -> None:
    """The plugin's layouts are refused, with the reason in its report; the plugin itself loads."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("badlayout", "gptzoo_fake_badlayout", _layouts_plugin(body))
    registry = gptzoo.get_registry()
    (info,) = [p for p in registry.plugins if p.distribution == "gptzoo-fake-badlayout"]
    assert info.status == "ok"
    assert info.refused == (
        f"its register_hf_layouts was refused (gptzoo_fake_badlayout (gptzoo-fake-badlayout 1.0) {error})",
    )
    assert "rmsnorm" in registry.names("norm") and registry.rows["register_hf_layouts"] == []


@pytest.mark.parametrize("override", [False, True])
def test_a_layout_of_a_built_in_class_is_used_only_with_override(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, override: bool
) -> None:
    """A plugin's "llama" layout of the built-in rmsnorm that names the epsilon otherwise: without
    override gptzoo's own stays (with a warning), with it the plugin's is what export writes."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    body = (
        "    register('gptzoo_plugins._norms:RMSNorm', 'llama', weights=lambda norm: [TensorMap('weight', "
        f"('weight',))], config=lambda norm: {{'rms_norm_eps': norm.eps * 2}}, override={override})"
    )
    fake_site.add("mine", "gptzoo_fake_mine", _layouts_plugin(body))
    registry = gptzoo.get_registry()
    model = gptzoo.build_model(gptzoo.load_recipe("llama-tiny", registry=registry), device="cpu", registry=registry)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_hf(model, tmp_path / "hf", registry=registry)
    said = [str(w.message) for w in caught if issubclass(w.category, gptzoo.GptzooWarning)]
    assert (
        said == []
        if override
        else said[0]
        == (
            "gptzoo_fake_mine (gptzoo-fake-mine 1.0) registers the Hugging Face 'llama' layout of "
            "gptzoo_plugins._norms:RMSNorm, which gptzoo has already; gptzoo's is used (register it with "
            "override=True to replace it)"
        )
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rms_norm_eps"] == (2e-5 if override else 1e-5)

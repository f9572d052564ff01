"""An attention feature reaches config.json through one table (gptzoo.hf.llama.ATTENTION_FEATURES, read by
attention_fields), and a family expresses it by having its field: every family that lacks the field refuses
the feature by that field's name, with no refusal of its own in its layout (GPT-2, GPT-NeoX and Phi-3 used to
list "no sinks, no qk-norm" in theirs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from fakedist import FakeSite

import gptzoo
from gptzoo.errors import CheckpointError
from gptzoo.hf import FAMILIES, NoEquivalentError, export_hf
from gptzoo.hf.llama import ATTENTION_FEATURES
from gptzoo.model.build import assemble

SMALL = "[model]\nn_layer = 2\nvocab_size = 64\ncontext_length = 64\nn_embd = 32\nn_head = 2\nd_ff = 48\n"
BASES = {
    "gpt2": 'extends = "gpt2-tiny"\n[model]\n',
    "llama": 'extends = "llama-tiny"\n[model]\n',
    "gpt_neox": 'extends = "pythia-160m"\n' + SMALL,
    "phi3": 'extends = "phi-3-mini"\n' + SMALL,
}
"""A small recipe of each family whose attention is gptzoo's causal one."""
SETTINGS = {
    "window": ("window = 8", "8"),
    "softcap": ("softcap = 30.0", "30.0"),
    "scale": ("scale = 0.0625", "256"),
    "qk_norm": ('qk_norm = "full"', "'full'"),
    "qkv_bias": ("qkv_bias = true", "True"),
    "sinks": ("sinks = true", "True"),
    "output_gate": ("output_gate = true", "True"),
}
"""Each feature as a recipe sets it, and its field's value as a refusal shows it."""


def test_every_feature_has_a_setting_here() -> None:
    assert sorted(SETTINGS) == sorted(ATTENTION_FEATURES)


def reasons(tmp_path: Path, family: str, setting: str) -> list[str]:
    recipe = BASES[family] + f'attention = {{ name = "causal", {setting} }}\n'
    if family != "phi3" and "qkv_bias" in setting:
        recipe += "bias = false\n"
    (tmp_path / "mine.toml").write_text(recipe)
    loaded = gptzoo.load_recipe(tmp_path / "mine.toml")
    components: list = []
    skeleton = assemble(loaded, gptzoo.get_registry(), torch.device("meta"), components)
    try:
        FAMILIES[family].config(loaded, skeleton, components)
    except NoEquivalentError as exc:
        return exc.reasons
    return []


@pytest.mark.parametrize("feature", SETTINGS)
@pytest.mark.parametrize("family", BASES)
def test_a_family_without_a_feature_s_field_refuses_it_by_that_field(tmp_path: Path, family: str, feature: str) -> None:
    field, _ = ATTENTION_FEATURES[feature]
    setting, shown = SETTINGS[feature]
    found = reasons(tmp_path, family, setting)
    spec = FAMILIES[family]
    refusal = f"attention 'causal' sets {field}={shown}, which {spec.architecture} has no field for"
    expresses = field in spec.known or field in spec.required or field in spec.per_layer or field in spec.implied
    assert (refusal in found) != expresses, found
    assert not any(reason.startswith("attention 'causal' (") for reason in found), found  # no layout's own refusal


SCALED_MLP = '''
import torch
from torch import nn

import gptzoo
from gptzoo_plugins._mlps import GatedMLP

gptzoo_contract = 7


class ScaledMLP(GatedMLP):
    """GatedMLP's output scaled per channel."""

    def __init__(self, d_model, d_ff, *, activation, bias):
        super().__init__(d_model, d_ff, activation=activation, bias=bias)
        self.scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return super().forward(x) * self.scale


@gptzoo.hookimpl
def register_mlps(register):
    register("scaled", ScaledMLP)
'''


def test_a_parameter_no_layout_maps_is_refused_by_the_coverage_check_naming_it(
    tmp_path: Path, fake_site: FakeSite
) -> None:
    """A plugin's subclass inherits its base's layout (the class table's MRO rule); a parameter that layout does
    not map is refused on export by the one coverage check, by name, with nothing written."""
    fake_site.add("scaled", "gz_scaled", SCALED_MLP)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("llama-tiny", ["model.mlp=scaled"], registry=registry)
    model = gptzoo.build_model(recipe, registry=registry)
    with pytest.raises(CheckpointError) as raised:
        export_hf(model, tmp_path / "hf", registry=registry)
    assert str(raised.value) == (
        "the LlamaForCausalLM weight map does not cover ['blocks.0.mlp.scale', 'blocks.1.mlp.scale'] (and maps "
        "unknown []); a component's layout is incomplete"
    )
    assert not (tmp_path / "hf").exists()


def test_a_model_holding_more_than_its_recipe_builds_is_refused_not_exported_without_it(tmp_path: Path) -> None:
    """export maps what a model of its recipe holds; a tensor added since (an adapter not merged) is refused by
    name instead of being left out of the checkpoint."""
    model = gptzoo.build_model(gptzoo.load_recipe("llama-tiny"), device="cpu")
    model.blocks[1].mlp.scale = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(CheckpointError) as raised:
        export_hf(model, tmp_path / "hf")
    assert str(raised.value) == (
        "the model holds blocks.1.mlp.scale, which a model of its recipe has not (adapters not merged, or a module "
        "changed after it was built), so LlamaForCausalLM would not hold them; merge or remove them, then export "
        f"(nothing was written to {tmp_path / 'hf'})"
    )
    assert not (tmp_path / "hf").exists()


def test_docs_name_every_family_s_layout() -> None:
    """docs/plugins.md's table of the layout names a plugin registers under is the families' own."""
    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")
    rows = {
        m[0]: (m[1], m[2], m[3] or None)
        for m in re.findall(r'^\| `(\w+)` \| (\w+) \| `"(\w+)"` \| (?:`"(\w+)"`)? \|$', docs, re.M)
    }
    assert rows == {
        name: (f.architecture, f.layout, f.extends.layout if f.extends is not None else None)
        for name, f in FAMILIES.items()
    }

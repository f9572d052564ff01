"""An attention feature reaches config.json through one table (gptzoo.hf.llama.ATTENTION_FEATURES, read by
attention_fields), and a family expresses it by having its field: every family that lacks the field refuses
the feature by that field's name, with no refusal of its own in its layout (GPT-2, GPT-NeoX and Phi-3 used to
list "no sinks, no qk-norm" in theirs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gptzoo
from gptzoo.hf import FAMILIES, NoEquivalentError
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

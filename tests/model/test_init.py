"""Initialization: GPT-2's rule for built-in components, a component's own reset_parameters for the rest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cli_run import run_error
from fakedist import FakeSite
from torch import nn

import gptzoo

CONSTANT_MLP = '''
import torch
from torch import nn

from gptzoo_plugins._mlps import DenseMLP


class ConstantMLP(DenseMLP):
    """A dense MLP that initializes itself: every weight 0.5, every bias 0.25."""

    def reset_parameters(self):
        for name, p in self.named_parameters():
            nn.init.constant_(p, 0.5 if name.endswith("weight") else 0.25)


class TanhLearned(nn.Module):
    """tanh(a * x) with a learned a, set to 3 by its own reset_parameters."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.empty(()))

    def forward(self, x):
        return torch.tanh(self.a * x)

    def reset_parameters(self):
        nn.init.constant_(self.a, 3.0)


class BrokenReset(DenseMLP):
    """A dense MLP whose reset_parameters raises."""

    def reset_parameters(self):
        raise RuntimeError("no init for you")


@gptzoo.hookimpl
def register_mlps(register):
    register("constant", ConstantMLP)
    register("broken_reset", BrokenReset)


@gptzoo.hookimpl
def register_activations(register):
    register("tanh_learned", TanhLearned)
'''


def old_gpt2_init(model: gptzoo.GPT, std: float) -> None:
    """GPT.init_weights as it was before components could initialize themselves (the reference)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        residual_std = std / math.sqrt(2 * len(model.blocks))
        for block in model.blocks:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)


@pytest.mark.parametrize("base", ["gpt2-tiny", "llama-tiny"])
@pytest.mark.parametrize("extra", [[], ["model.position=learned", "model.norm_placement=post"]])
def test_built_in_models_draw_exactly_the_old_gpt2_initialization(base: str, extra: list[str]) -> None:
    recipe = gptzoo.load_recipe(base, extra)
    torch.manual_seed(1234)
    new = gptzoo.build_model(recipe)
    after_new = torch.randn(3)  # the RNG is left where the old rule left it, too
    torch.manual_seed(1234)
    reference = gptzoo.model.build.assemble(recipe, gptzoo.get_registry(), torch.device("cpu"))
    old_gpt2_init(reference, recipe.model.init_std)
    after_old = torch.randn(3)
    assert new.state_dict().keys() == reference.state_dict().keys()
    for key, tensor in reference.state_dict().items():
        assert torch.equal(new.state_dict()[key], tensor), key
    assert torch.equal(after_new, after_old)


def test_a_plugin_mlp_with_reset_parameters_keeps_its_own_weights(fake_site: FakeSite) -> None:
    fake_site.add("constant", "gptzoo_fake_constant", CONSTANT_MLP)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.mlp=constant"], registry=registry)
    torch.manual_seed(0)
    model = gptzoo.build_model(recipe, registry=registry)
    for block in model.blocks:
        assert torch.all(block.mlp.c_fc.weight == 0.5) and torch.all(block.mlp.c_proj.weight == 0.5)
        assert torch.all(block.mlp.c_fc.bias == 0.25) and torch.all(block.mlp.c_proj.bias == 0.25)
    # the rest is GPT-2's, with the residual scaling on the attentions' c_proj
    residual = 0.02 / math.sqrt(2 * recipe.model.n_layer)
    assert model.blocks[0].attn.c_proj.weight.std().item() == pytest.approx(residual, rel=0.1)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert all(torch.all(b.attn.c_attn.bias == 0) for b in model.blocks)


def test_a_nested_activation_with_reset_parameters_is_reset_inside_a_built_in_mlp(fake_site: FakeSite) -> None:
    fake_site.add("constant", "gptzoo_fake_constant", CONSTANT_MLP)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("gpt2-tiny", ["model.activation=tanh_learned"], registry=registry)
    model = gptzoo.build_model(recipe, registry=registry)
    assert [b.mlp.act.a.item() for b in model.blocks] == [3.0] * recipe.model.n_layer
    residual = 0.02 / math.sqrt(2 * recipe.model.n_layer)
    assert model.blocks[1].mlp.c_proj.weight.std().item() == pytest.approx(residual, rel=0.1)


def test_a_reset_parameters_that_raises_names_its_plugin(
    fake_site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("constant", "gptzoo_fake_constant", CONSTANT_MLP)
    out = tmp_path / "out"
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.mlp=broken_reset", "--out", str(out)) == (
        "error: mlp 'broken_reset' from gptzoo_fake_constant (gptzoo-fake-constant 1.0) failed to reset its "
        "parameters: RuntimeError: no init for you; fix the plugin, or choose another mlp"
    )
    assert not out.exists()

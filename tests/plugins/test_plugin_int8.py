"""--dtype int8 leaves a plugin component working that reads its linears' weights itself (an MoE that
slices them per expert does): the quantized linear's weight is the dequantized one."""

from __future__ import annotations

import json

import pytest
import torch
from fakedist import FakeSite

from gptzoo.cli import main
from gptzoo.inference.quantize import Int8Linear

WEIGHT_READER = """
import torch
import torch.nn.functional as F
from torch import nn

import gptzoo


class HalvesMLP(nn.Module):
    '''A dense MLP computed as two halves of its hidden layer, each a slice of c_fc.weight.'''

    def __init__(self, *, d_model: int, d_ff: int, bias: bool, activation: nn.Module) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=False)
        self.c_proj = nn.Linear(d_ff, d_model, bias=False)
        self.act = activation

    def forward(self, x):
        half = self.c_fc.weight.shape[0] // 2
        h = torch.cat([F.linear(x, w) for w in (self.c_fc.weight[:half], self.c_fc.weight[half:])], dim=-1)
        return self.c_proj(self.act(h))

    def flops(self, batch, seq_len):
        n = batch * seq_len
        return {"c_fc": 2 * n * self.c_fc.in_features * self.c_fc.out_features,
                "c_proj": 2 * n * self.c_proj.in_features * self.c_proj.out_features}


@gptzoo.hookimpl
def register_mlps(register):
    register("halves", HalvesMLP)
"""


def test_an_int8_linear_reads_as_its_dequantized_weight() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    quantized = Int8Linear.from_linear(linear)
    error = (quantized.weight - linear.weight).abs().max(dim=1).values
    assert (error <= linear.weight.abs().max(dim=1).values / 254 + 1e-7).all()  # half a step of each row's scale
    x = torch.randn(3, 64)
    assert torch.allclose(quantized(x), torch.nn.functional.linear(x, quantized.weight, quantized.bias), atol=1e-5)


def test_a_plugin_that_slices_its_weights_generates_in_int8(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("halves", "gptzoo_fake_halves", WEIGHT_READER)
    argv = ["generate", "gpt2-tiny", "--set", "model.mlp=halves", "--prompt", "hello", "--max-new-tokens", "4"]
    assert main([*argv, "--seed", "1", "--dtype", "int8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"][0]) == 4

"""Batch-1 CPU decoding through numpy's BLAS: same numbers, everything restored afterwards."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model  # tests/ has no __init__.py: pytest puts it on sys.path
from torch import nn

from gptzoo.inference.matvec import blas_decoding


@pytest.mark.parametrize("base", ["gpt2-tiny", "llama-tiny"])
def test_one_token_logits_match_torch_and_layers_are_restored(base: str) -> None:
    model = tiny_model(base)
    threads = torch.get_num_threads()
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        expected = model(idx[:, -1:])
        full = model(idx)
        with blas_decoding(model) as rerouted:
            assert rerouted == len(linears) > 0
            assert torch.get_num_threads() == 1
            got = model(idx[:, -1:])
            several = model(idx)  # more than one row: the layers' own forward
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(several, full, rtol=0, atol=1e-6)  # one thread instead of several: last bits only
    assert torch.get_num_threads() == threads
    assert not any("forward" in vars(m) for m in linears)


def test_restored_when_the_block_raises() -> None:
    model = tiny_model("gpt2-tiny")
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"), blas_decoding(model):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == threads
    assert not any("forward" in vars(m) for m in model.modules())


def test_other_dtypes_and_linear_subclasses_are_left_alone() -> None:
    assert_untouched = lambda model: not any("forward" in vars(m) for m in model.modules())
    model = tiny_model("gpt2-tiny").to(torch.bfloat16)
    threads = torch.get_num_threads()
    with blas_decoding(model) as rerouted:
        assert rerouted == 0 and torch.get_num_threads() == threads and assert_untouched(model)

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    net = nn.Sequential(Scaled(4, 3), nn.Linear(3, 2))
    x = torch.randn(1, 4)
    with torch.no_grad():
        expected = net(x)
        with blas_decoding(net) as rerouted:
            assert rerouted == 1 and "forward" not in vars(net[0])
            torch.testing.assert_close(net(x), expected, rtol=0, atol=1e-6)


def test_inputs_that_need_grad_take_the_layers_own_forward() -> None:
    net = nn.Linear(4, 3)
    x = torch.randn(1, 4, requires_grad=True)
    with blas_decoding(net):
        net(x).sum().backward()
    assert x.grad is not None and net.weight.grad is not None

"""gptzoo.training.loss.cross_entropy: F.cross_entropy(logits.float(), targets) in value and gradient, block by
block, in either dtype, scaled or not, with or without a gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptzoo.training import loss
from gptzoo.training.loss import cross_entropy


def reference(logits: torch.Tensor, targets: torch.Tensor, scale: float) -> tuple[float, torch.Tensor]:
    leaf = logits.detach().requires_grad_()
    value = F.cross_entropy(leaf.float().view(-1, leaf.size(-1)), targets.view(-1))
    (value * scale).backward()
    return value.item(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_equals_f_cross_entropy_over_several_blocks(monkeypatch, dtype, scale) -> None:
    monkeypatch.setattr(loss, "CPU_BLOCK", 3 * 1000)  # three rows a block: 4 blocks, the last one short
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 1000, generator=generator) * 4).to(dtype)
    targets = torch.randint(0, 1000, (2, 5), generator=generator)
    expected, expected_grad = reference(logits, targets, scale)
    leaf = logits.clone().requires_grad_()
    value = cross_entropy(leaf, targets)
    (value * scale).backward()
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert leaf.grad.dtype == dtype
    tolerance = (2**-20 if dtype == torch.float32 else 2**-8) * expected_grad.abs().max().item()
    assert (leaf.grad.float() - expected_grad.float()).abs().max().item() <= tolerance


def test_without_a_gradient_it_keeps_none() -> None:
    logits, targets = torch.randn(6, 50), torch.randint(0, 50, (6,))
    with torch.no_grad():
        value = cross_entropy(logits, targets)
    assert value.item() == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-6)
    assert value.grad_fn is None


def test_a_retained_graph_gives_the_same_gradient_twice() -> None:
    leaf = torch.randn(4, 30, requires_grad=True)
    value = cross_entropy(leaf, torch.tensor([0, 29, 3, 3]))
    value.backward(retain_graph=True)
    first = leaf.grad.clone()
    (value * 2).backward()
    assert torch.allclose(leaf.grad, 3 * first, rtol=1e-6, atol=0)


def test_large_logits_stay_finite() -> None:
    logits = torch.tensor([[1e4, 0.0, -1e4], [-3e4, 3e4, 0.0]], requires_grad=True)
    value = cross_entropy(logits, torch.tensor([1, 1]))
    value.backward()
    assert value.item() == pytest.approx(1e4 / 2)
    assert torch.equal(logits.grad, torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))

"""gptzoo.model.sdpa: torch's scaled_dot_product_attention, except that causal bfloat16 attention being trained
on a CPU takes its gradient from torch's float32 kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptzoo.model import sdpa
from gptzoo.model.sdpa import scaled_dot_product_attention

pytestmark = pytest.mark.skipif(sdpa._BACKWARD is None, reason="this torch has no CPU flash-attention kernels")


def qkv(n_kv_head: int = 4, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(2, 4, 37, 16), (2, n_kv_head, 37, 16), (2, n_kv_head, 37, 16)]
    return [torch.randn(shape, generator=generator).to(dtype).requires_grad_() for shape in shapes]


def gradients(fn, tensors: list[torch.Tensor], grad: torch.Tensor, **kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves, **kwargs)
    out.backward(grad.to(out.dtype))
    return out, [t.grad for t in leaves]


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_bfloat16_training_takes_the_float32_backward(n_kv_head: int) -> None:
    tensors = qkv(n_kv_head)
    grad = torch.randn(2, 4, 37, 16, generator=torch.Generator().manual_seed(1))
    kwargs = {"is_causal": True, "scale": 0.3, "enable_gqa": n_kv_head != 4}
    out, ours = gradients(scaled_dot_product_attention, tensors, grad, **kwargs)
    assert out.grad_fn is not None and "Float32Backward" in out.grad_fn.name()
    expected_out = F.scaled_dot_product_attention(*tensors, **kwargs)
    assert torch.equal(out, expected_out)  # the same bfloat16 forward kernel
    # the gradient is float32's of the same bfloat16 inputs and output, rounded once to bfloat16
    _, exact = gradients(F.scaled_dot_product_attention, [t.double() for t in tensors], grad.double(), **kwargs)
    _, torchs = gradients(F.scaled_dot_product_attention, tensors, grad, **kwargs)
    for mine, theirs, truth in zip(ours, torchs, exact, strict=True):
        assert mine.dtype == torch.bfloat16
        error, torch_error = (mine.double() - truth).abs().max().item(), (theirs.double() - truth).abs().max().item()
        assert error <= 1.5 * torch_error + 1e-3
        assert error <= 2**-7 * truth.abs().max().item()


def test_autocast_float32_inputs_take_it_too() -> None:
    tensors = qkv(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(*tensors, is_causal=True)
    assert out.dtype == torch.bfloat16 and "Float32Backward" in out.grad_fn.name()
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in tensors)


@pytest.mark.parametrize(
    "case",
    ["float32", "no gradient", "not causal", "masked"],
)
def test_everything_else_is_torchs(case: str) -> None:
    tensors = qkv(dtype=torch.float32 if case == "float32" else torch.bfloat16)
    kwargs = {"is_causal": case != "not causal"}
    if case == "masked":
        kwargs = {"attn_mask": torch.ones(37, 37, dtype=torch.bool).tril()}
    with torch.set_grad_enabled(case != "no gradient"):
        out = scaled_dot_product_attention(*tensors, **kwargs)
        expected = F.scaled_dot_product_attention(*tensors, **kwargs)
    assert torch.equal(out, expected)
    assert out.grad_fn is None if case == "no gradient" else "Float32Backward" not in out.grad_fn.name()

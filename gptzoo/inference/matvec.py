"""Batch-1 decoding on CPU: float32 matrix-vector products through numpy's BLAS.

At batch 1 every Linear layer is a matrix-vector product, and its speed is the speed at which its
weights stream from memory. torch's CPU wheels compute it with MKL, whose float32 GEMV reads the
weights at ~8-14 GB/s on the AMD EPYC machines gptzoo is developed on; the OpenBLAS that numpy's
wheels ship reads the same (out, in) matrices at ~20 GB/s there (bench/README.md has the numbers).
So while a single sequence is decoded on CPU in float32, plain ``nn.Linear`` layers compute through
numpy on zero-copy views of their own tensors. OpenBLAS runs its own threads and torch's would
compete with them for the cores, so torch runs single-threaded meanwhile: what is left for it at
batch 1 (norms, attention over the cache, activations) is tiny.

Only ``type(m) is nn.Linear`` is rerouted (a subclass may compute something else), only for inputs
of one row, and everything else falls back to the layer's own forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class _MatVec:
    """A replacement forward for one nn.Linear: y = x W^T + b through numpy for a single row."""

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear
        self.weight_t = linear.weight.detach().numpy().T  # (in, out), a view of the (out, in) tensor
        self.bias = None if linear.bias is None else linear.bias.detach().numpy()

    def __call__(self, x: Tensor) -> Tensor:
        if (
            x.numel() != x.shape[-1]
            or x.dtype != torch.float32
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")
        ):
            return type(self.linear).forward(self.linear, x)
        y = x.reshape(1, -1).numpy() @ self.weight_t  # (1, out)
        if self.bias is not None:
            y += self.bias
        return torch.from_numpy(y).view(*x.shape[:-1], -1)


def _eligible(module: nn.Module) -> bool:
    if type(module) is not nn.Linear:
        return False
    w = module.weight
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.layout == torch.strided


@contextmanager
def blas_decoding(model: nn.Module) -> Iterator[int]:
    """Within the block, the model's float32 CPU Linear layers compute single rows through numpy's
    BLAS and torch runs on one thread; both are restored on exit. Yields how many layers were
    rerouted (0 for a model on a GPU or in another dtype, which is left as it is)."""
    linears = [
        m for m in model.modules() if _eligible(m) and "forward" not in vars(m)
    ]  # not one already rerouted or hooked
    if not linears:
        yield 0
        return
    threads = torch.get_num_threads()
    for m in linears:
        m.forward = _MatVec(m)  # an instance attribute shadows the class's forward
    torch.set_num_threads(1)
    try:
        yield len(linears)
    finally:
        torch.set_num_threads(threads)
        for m in linears:
            del m.forward

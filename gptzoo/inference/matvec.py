"""Few-row CPU decoding: every Linear layer's product through the native kernels (native/gemv.c).

While a model decodes on a CPU, each step multiplies a few rows (one per sequence) by every weight
matrix, so its speed is the speed at which the weights stream from memory. torch's CPU kernels for
such products read float32 weights at about a third of the machine's bandwidth (bench/README.md has
the numbers); the native kernels read them at close to it, in float32, bfloat16 and int8
(:mod:`gptzoo.inference.quantize`), and sum each output in a fixed order whatever the number of
threads, so the tokens do not depend on it.

Within :func:`native_decoding`, plain ``nn.Linear`` layers (``type(m) is nn.Linear``: a subclass may
compute something else) on the CPU compute inputs of at most :data:`MAX_ROWS` rows through the
kernels, torch runs on one thread (what is left for it, norms and attention over the cache, is small
at these sizes), and :class:`ThreadTuner` picks the kernels' threads from the measured step times:
when another process shares the cores, one thread that is never descheduled beats two that wait for
each other. Anything else (gradients, autocast, longer inputs such as a prefill) takes the layer's
own forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from gptzoo.inference.native import library
from gptzoo.inference.native.abi import DTYPES

MAX_ROWS = 32
"""The most rows the kernels take; longer inputs (a prefill) go to torch's matrix-matrix kernels."""

KINDS = {
    torch.float32: DTYPES["f32"],
    torch.bfloat16: DTYPES["bf16"],
    torch.int8: DTYPES["i8"],
    torch.uint8: DTYPES["q4"],
}
"""Tensor dtype -> the kernels' code for it (gptzoo.inference.native.abi): uint8 weights hold 4-bit blocks."""
QUANTIZED = {torch.int8: torch.float32, torch.uint8: torch.float16}
"""A quantized weight's dtype -> its scales' (int8: one per row; 4-bit blocks: a scale and a minimum per
block)."""
Q4_BLOCK = 32
"""Weights per 4-bit block (gptzoo.inference.quantize.Int4Linear)."""


def scale_shape(weight: Tensor, in_features: int) -> tuple[int, ...]:
    """The shape the kernels read a quantized weight's scales in: int8 (out,), 4-bit blocks (out, 2,
    in / Q4_BLOCK), a row's scales then its minimums."""
    if weight.dtype == torch.uint8:
        return (weight.shape[0], 2, in_features // Q4_BLOCK)
    return (weight.shape[0],)


ACTIVATIONS = (torch.float32, torch.bfloat16)


class ThreadTuner:
    """The kernels' thread count, chosen from step times: mostly the one measured faster, with a
    step of the other from the second step on and then every EXPLORE_EVERY steps, so that a
    change in the machine's load is noticed. A trial that loses clearly (by LOSING_MARGIN) doubles
    the wait before the next one, up to EXPLORE_MOST steps: on a quiet machine a trial of one
    thread costs a step at half speed. A change of the faster count starts the waits over. The
    thread count never changes the numbers."""

    EXPLORE_EVERY = 64
    """Steps between two trials of the other thread count at first, and after the faster one changed."""
    EXPLORE_MOST = 512
    """The longest wait between two trials."""
    LOSING_MARGIN = 1.25
    """A trial whose step took this many times the faster count's loses clearly."""

    def __init__(self, most: int) -> None:
        self.choices = [most, 1] if most > 1 else [1]
        self.seconds: dict[int, float] = {}
        """thread count -> its latest smoothed step time"""
        self.current = self.choices[0]
        self._steps = 0
        self._wait = self.EXPLORE_EVERY
        self._next_trial = 1  # the first trial right after step 1

    @property
    def best(self) -> int:
        """The thread count with the shortest smoothed step time (the most, before any step)."""
        return min(self.seconds, key=self.seconds.__getitem__, default=self.choices[0])

    def record(self, seconds: float) -> None:
        """Account one decoding step of ``seconds`` at :attr:`current` threads; choose the next."""
        best_before = self.best
        trial = self.current != best_before
        old = self.seconds.get(self.current)
        self.seconds[self.current] = seconds if old is None else 0.7 * old + 0.3 * seconds
        self._steps += 1
        if len(self.choices) == 1:
            return
        best = self.best
        if best != best_before:
            self._wait = self.EXPLORE_EVERY
        elif trial and seconds > self.LOSING_MARGIN * self.seconds[best]:
            self._wait = min(2 * self._wait, self.EXPLORE_MOST)
        if trial or best != best_before:
            self._next_trial = self._steps - 1 + self._wait  # the wait counts from this step
        if self._steps == self._next_trial:
            self.current = next(c for c in self.choices if c != best)
        else:
            self.current = best


class _NativeLinear:
    """A replacement forward for one nn.Linear: its product through the kernels for few-row inputs."""

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear

    def __call__(self, x: Tensor) -> Tensor:
        y = native_linear(x, self.linear.weight, self.linear.bias, None)
        return nn.Linear.forward(self.linear, x) if y is None else y


def runs_its_class_forward(module: nn.Module) -> bool:
    """Whether ``module`` computes what its class's forward does: no forward of its own on the
    instance (but native_decoding's, which computes the same product) and no forward hooks."""
    own = vars(module).get("forward")
    rerouted = own is None or isinstance(own, _NativeLinear)
    return rerouted and not (module._forward_hooks or module._forward_pre_hooks)


_tuner: ThreadTuner | None = None
"""The tuner of the native_decoding block running now, if any."""


def kernel_threads() -> int:
    """The kernels' thread count: the running native_decoding block's choice, else torch's."""
    return _tuner.current if _tuner is not None else torch.get_num_threads()


def native_linear(x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None) -> Tensor | None:
    """x W^T (* scale) + b through the kernels, or None where they do not apply: no kernels, a
    tensor off the CPU, more than MAX_ROWS rows, gradients or autocast wanted, dtypes they lack
    (they take contiguous weights of the input's dtype, or int8 ones with a float32 ``scale`` per
    output, or 4-bit blocks packed two to a uint8 with float16 ``scale`` (scale_shape), and a bias of
    the input's dtype)."""
    lib = library()  # built once, then cached
    if lib is None or x.dtype not in ACTIVATIONS or x.device.type != "cpu":
        return None
    in_features = x.shape[-1]
    rows = x.numel() // in_features if in_features else 0
    if not 0 < rows <= MAX_ROWS or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return None
    if scale is None:
        if weight.dtype != x.dtype or not weight.is_contiguous():
            return None
    elif QUANTIZED.get(weight.dtype) != scale.dtype or not (weight.is_contiguous() and scale.is_contiguous()):
        return None
    if weight.dtype == torch.uint8 and (in_features != 2 * weight.shape[1] or in_features % Q4_BLOCK):
        return None
    if scale is not None and tuple(scale.shape) != scale_shape(weight, in_features):
        return None
    if bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous()):
        return None
    out_features = weight.shape[0]
    x2 = x.reshape(rows, in_features).contiguous()
    y = torch.empty(rows, out_features, dtype=x.dtype)
    code = lib.gemv(
        KINDS[weight.dtype],
        weight.data_ptr(),
        None if scale is None else scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        KINDS[x.dtype],
        x2.data_ptr(),
        KINDS[x.dtype],
        y.data_ptr(),
        rows,
        out_features,
        in_features,
        kernel_threads(),
    )
    if code != 0:
        raise MemoryError(f"the CPU kernels could not allocate {rows * in_features * 4} bytes")
    return y.view(*x.shape[:-1], out_features)


def _eligible(module: nn.Module) -> bool:
    if type(module) is not nn.Linear or "forward" in vars(module):  # not one already rerouted or hooked
        return False
    w = module.weight
    return w.device.type == "cpu" and w.dtype in ACTIVATIONS and w.layout == torch.strided and w.is_contiguous()


@contextmanager
def native_decoding(model: nn.Module) -> Iterator[ThreadTuner | None]:
    """Within the block, the model's CPU Linear layers compute few-row inputs through the native
    kernels, as layers that always do (``uses_native_kernels = True``: int8 ones) do anyway, and
    torch runs on one thread; all is restored on exit.
    Yields the ThreadTuner that the caller feeds with step times, or None when no layer computes
    through the kernels (none available, a model on a GPU, no eligible layer)."""
    global _tuner
    linears = [m for m in model.modules() if _eligible(m)]
    own = any(getattr(m, "uses_native_kernels", False) for m in model.modules())  # e.g. quantize's Int8Linear
    if library() is None or _tuner is not None or not (linears or own):
        yield None
        return
    threads = torch.get_num_threads()
    _tuner = ThreadTuner(threads)
    for m in linears:
        m.forward = _NativeLinear(m)  # an instance attribute shadows the class's forward
    torch.set_num_threads(1)
    try:
        yield _tuner
    finally:
        _tuner = None
        torch.set_num_threads(threads)
        for m in linears:
            del m.forward

"""``scaled_dot_product_attention`` for attention components: torch's, except where its CPU backward is slow.

torch's CPU flash-attention backward in bfloat16 is several times slower than its float32 backward on the
same sizes: GPT-2 small's heads (4 x 12 x 128 x 64), 14.1 ms a layer in bfloat16 against 3.9 ms in float32
(torch 2.13, a 2-core Xeon with AMX), and 59 against 38 ms at 512 tokens. So when gradients are wanted of
causal, unmasked bfloat16 attention on a CPU, the forward is torch's bfloat16 kernel and the backward is its
float32 kernel on the same saved tensors, and hence also the more exact gradient. Everything else goes to
``torch.nn.functional.scaled_dot_product_attention`` unchanged, and inference never takes this path.

Attention plugins call :func:`scaled_dot_product_attention` with F.scaled_dot_product_attention's arguments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# torch's private CPU flash-attention kernels (present since torch 2.2); without them every call goes to F's
_FORWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


class _Float32Backward(torch.autograd.Function):
    """Causal attention of (B, nh, T, hs) bfloat16 q, k, v: the forward in bfloat16, the backward in float32."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:  # type: ignore[override]
        out, logsumexp = _FORWARD(q, k, v, 0.0, True, attn_mask=None, scale=scale)
        ctx.save_for_backward(q, k, v, out, logsumexp)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, logsumexp = ctx.saved_tensors
        wide = (t.float() for t in (grad, q, k, v, out))
        grads = _BACKWARD(*wide, logsumexp, 0.0, True, attn_mask=None, scale=ctx.scale)
        return *(g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)), None


def _effective_dtype(q: Tensor) -> torch.dtype:
    """The dtype F.scaled_dot_product_attention would compute in: autocast's, where autocast is on."""
    device = q.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype


def _float32_backward_applies(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> bool:
    return (
        _BACKWARD is not None
        and is_causal
        and attn_mask is None
        and q.device.type == "cpu"
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (q, k, v))
        and q.shape[-2] == k.shape[-2]
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and _effective_dtype(q) == torch.bfloat16
    )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """F.scaled_dot_product_attention (no dropout), with a float32 backward for causal bfloat16 training on a
    CPU. q (B, nh, T, hs), k and v (B, nkv, S, hs); with ``enable_gqa`` each group of nh / nkv query heads
    shares a key/value head, as in F's."""
    if not _float32_backward_applies(q, k, v, attn_mask, is_causal):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    if enable_gqa and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return _Float32Backward.apply(q, k, v, scale)

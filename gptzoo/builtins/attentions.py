"""Causal multi-head self-attention (Vaswani et al., 2017) with grouped key/value heads.

n_kv_head == n_head is MHA; fewer is GQA (Ainslie et al., 2023); one is MQA (Shazeer, 2019).
q, k and v come from one fused projection ``c_attn`` (d -> (nh + 2 nkv) hs, q rows first, then k,
then v), as in nanoGPT and GPT-2. Two registered variants differ only in how scores are computed:

- causal: torch.nn.functional.scaled_dot_product_attention (fused kernels where available);
- eager: the explicit softmax(Q K^T / sqrt(d_k) + M) V, M the causal mask (plus any position bias).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.hookspecs import hookimpl
from gptzoo.interfaces import AttentionContext, LayerKVCache, TensorMap


class CausalSelfAttention(nn.Module):
    """Causal self-attention with n_kv_head key/value heads and a per-layer KV cache."""

    def __init__(self, d_model: int, n_head: int, *, n_kv_head: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.c_attn = nn.Linear(d_model, (n_head + 2 * n_kv_head) * head_dim, bias=bias)
        self.c_proj = nn.Linear(n_head * head_dim, d_model, bias=bias)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split((nh * hs, nkv * hs, nkv * hs), dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if ctx.rotary is not None:
            q, k = ctx.rotary.apply(q, k)
        if cache is not None:
            k, v = cache.update(k, v, ctx.start)  # (B, nkv, start + T, hs)
        y = self.attend(q, k, v, ctx)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * hs))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """q (B, nh, Tq, hs), k and v (B, nkv, Tk, hs) -> (B, nh, Tq, hs)."""
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=ctx.mask, is_causal=ctx.is_causal, enable_gqa=k.shape[1] != q.shape[1]
        )

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LayerKVCache:
        return LayerKVCache(batch_size, self.n_kv_head, max_len, self.head_dim, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        return 2 * batch_size * self.n_kv_head * max_len * self.head_dim * dtype.itemsize

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n_tokens = batch * seq_len
        # Q K^T and att @ V: 2 matmuls of (T x hs) by (hs x T) per head, full T^2 (no causal halving).
        scores = 2 * 2 * batch * self.n_head * seq_len * seq_len * self.head_dim
        return {"attention projections": linear_flops(n_tokens, self.c_attn, self.c_proj), "attention scores": scores}

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        kinds = ("weight", "bias") if self.c_attn.bias is not None else ("weight",)
        if family == "gpt2":  # Conv1D: [in, out]
            return [
                TensorMap(f"{name}.{k}", (f"{name}.{k}",), transpose=k == "weight")
                for name in ("c_attn", "c_proj")
                for k in kinds
            ]
        if family == "llama":
            sizes = (self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim)
            return [
                *(TensorMap(f"c_attn.{k}", (f"q_proj.{k}", f"k_proj.{k}", f"v_proj.{k}"), sizes=sizes) for k in kinds),
                *(TensorMap(f"c_proj.{k}", (f"o_proj.{k}",)) for k in kinds),
            ]
        return None


class EagerSelfAttention(CausalSelfAttention):
    """Causal self-attention computed explicitly: softmax(QK^T/sqrt(d_k) + M)V."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        B, nkv, Tk, hs = k.shape
        group = q.shape[1] // nkv
        k = k[:, :, None].expand(B, nkv, group, Tk, hs).reshape(B, nkv * group, Tk, hs)  # (B, nh, Tk, hs)
        v = v[:, :, None].expand(B, nkv, group, Tk, hs).reshape(B, nkv * group, Tk, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, Tq, Tk)
        if ctx.is_causal:
            future = torch.ones(q.shape[2], Tk, dtype=torch.bool, device=q.device).triu(1)
            att = att.masked_fill(future, float("-inf"))
        if ctx.mask is not None:
            att = att + ctx.mask
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        return att @ v  # (B, nh, Tq, hs)


@hookimpl
def register_attentions(register):
    register("causal", CausalSelfAttention, doc="Causal self-attention through scaled_dot_product_attention")
    register("eager", EagerSelfAttention)

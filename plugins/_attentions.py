"""Causal multi-head self-attention (Vaswani et al., 2017) with grouped key/value heads.

n_kv_head == n_head is MHA; fewer is GQA (Ainslie et al., 2023); one is MQA (Shazeer, 2019).
q, k and v come from one fused projection ``c_attn`` (d -> (nh + 2 nkv) hs, q rows first, then k,
then v), as in nanoGPT and GPT-2 (gptzoo.hf's layouts split or interleave it as each checkpoint format
stores it). Two registered variants differ only in how scores are computed:

- causal: scaled_dot_product_attention (gptzoo.model.sdpa: torch's fused kernels, with a float32 backward for
  bfloat16 training on a CPU);
- eager: the explicit softmax(Q K^T / sqrt(d_k) + M) V, M the causal mask (plus any position bias).

Both take the parameters that modern families add, each off by default:

- ``window``: sliding-window attention (Beltagy et al., 2020; Mistral, Gemma 2/3): a query at index i
  sees the keys i - window + 1 .. i (as transformers' sliding_window). The KV cache keeps only the
  last ``window`` keys (a ring buffer), and a pass over more than 4 x ``window`` queries is computed
  in blocks of 4 x ``window`` queries, each against its own keys, so its cost grows as T x window,
  not T^2 (up to 4 x window, one masked square: transformers' sums, bit for bit).
  ``sliding_window`` is the same layer with a window required (default 4096).
- ``softcap``: attention logit soft-capping, scores = c tanh(scores / c) before the mask (Gemma 2);
  computed explicitly, since scaled_dot_product_attention has no such step.
- ``scale``: the score scale instead of 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-1/2).
- ``qk_norm``: normalize queries and keys with the layer's norm (built at the width it needs through
  the ``norm`` builder the model passes), before rotary: "head" over each head's head_dim (Qwen3,
  Gemma 3; Dehghani et al., 2023), "full" over the whole q and k projections (OLMo 2).
- ``qkv_bias``: biases on q, k and v even when the recipe's ``bias`` is false (Qwen2: the output
  projection has none).
- ``sinks``: attention sinks (gpt-oss; Xiao et al., 2023, learned): a parameter ``sinks`` (nh,), one
  logit per head that joins each query's softmax denominator as an extra key with no value, so a head
  may attend to nothing. As transformers 5's gpt_oss eager_attention_forward (s_aux): the sink is a
  last score column, after the scale, softcap and mask, dropped after the softmax. Computed
  explicitly (scaled_dot_product_attention has no such term), in every pass: with a window, with a
  cache, one query at a time (the native decoding step adds the same column: gptzoo.inference.lowerings).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import AttentionContext, LayerKVCache
from gptzoo.model.sdpa import scaled_dot_product_attention

QK_NORMS = ("none", "head", "full")
"""Where ``qk_norm`` normalizes: not at all, over each head, over the whole projection."""


class WindowKVCache(LayerKVCache):
    """A ring buffer of the last ``window`` keys and values (B, nkv, window, hs): key i sits at
    slot i % window. It accepts ``max_len`` positions in all while holding at most ``window``."""

    def __init__(
        self,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        window: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(batch_size, n_kv_head, min(window, max_len), head_dim, device=device, dtype=dtype)
        self.positions = max_len

    @property
    def max_len(self) -> int:
        return self.positions

    def recent(self, start: int) -> tuple[Tensor, Tensor, int]:
        """The keys and values held before index ``start`` (those of indices first..start-1, in order), and first."""
        size = self.k.shape[2]
        first = max(0, start - size)
        slots = torch.arange(first, start, device=self.k.device) % size
        return self.k[:, :, slots], self.v[:, :, slots], first

    def write(self, k: Tensor, v: Tensor, start: int) -> None:
        """Keep the last ``window`` of k, v (B, nkv, T, hs), the keys of indices start..start+T-1."""
        size, T = self.k.shape[2], k.shape[2]
        keep = min(T, size)
        slots = torch.arange(start + T - keep, start + T, device=self.k.device) % size
        self.k[:, :, slots] = k[:, :, T - keep :]
        self.v[:, :, slots] = v[:, :, T - keep :]


def window_mask(ctx: AttentionContext, queries: range, keys: range, window: int, dtype: torch.dtype) -> Tensor:
    """The additive mask (B or 1, nh or 1, Tq, Tk) of queries at indices ``queries`` over keys at
    indices ``keys``: causal, within the window, no padding key (a padding query sees itself), plus
    the position bias."""
    pos = ctx.positions
    if pos is None:
        raise ValueError("a sliding window needs the positions of queries and keys (AttentionContext.positions)")
    device = pos.queries.device
    q_index = torch.arange(queries.start, queries.stop, device=device)[:, None]
    k_index = torch.arange(keys.start, keys.stop, device=device)[None, :]
    allowed = (k_index <= q_index) & (q_index - k_index < window)  # (Tq, Tk)
    if pos.key_mask is not None:
        key_mask = pos.key_mask[:, keys.start : keys.stop]  # (B, Tk)
        allowed = ((allowed & key_mask[:, None, :]) | (k_index == q_index))[:, None]  # (B, 1, Tq, Tk)
    mask = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
    if ctx.attn_bias is not None:
        q_pos = pos.queries[:, queries.start - pos.start : queries.stop - pos.start]
        bias = ctx.attn_bias(q_pos, pos.keys[:, keys.start : keys.stop])
        if bias is not None:
            mask = mask + bias
    return mask.to(dtype)


BLOCK_WINDOWS = 4
"""A sliding-window pass computes blocks of BLOCK_WINDOWS x window queries: up to that many queries
it is one masked square, exactly as transformers computes it (the same sums in the same order);
beyond, each block sees at most (BLOCK_WINDOWS + 1) x window keys, so the cost grows as T x window."""


def window_blocks(start: int, n_queries: int, window: int, first_key: int = 0) -> list[tuple[range, range]]:
    """(query indices, key indices) of each block of at most BLOCK_WINDOWS x ``window`` queries of a
    pass over ``n_queries`` queries from index ``start``, with keys held from ``first_key``: a block's
    keys are those its queries may see (from window - 1 before its first query to its last query)."""
    blocks, size = [], BLOCK_WINDOWS * window
    for q0 in range(start, start + n_queries, size):
        q1 = min(q0 + size, start + n_queries)
        blocks.append((range(q0, q1), range(max(first_key, q0 - window + 1), q1)))
    return blocks


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    scale: float,
    softcap: float = 0.0,
    sinks: Tensor | None = None,
) -> Tensor:
    """softmax(softcap(Q K^T scale) + M) V computed step by step: q (B, nh, Tq, hs), k and v (B, nkv, Tk, hs);
    ``sinks`` (nh,): a sink logit per head in each row's softmax (an extra key column, dropped after)."""
    B, nkv, Tk, hs = k.shape
    group = q.shape[1] // nkv
    k = k[:, :, None].expand(B, nkv, group, Tk, hs).reshape(B, nkv * group, Tk, hs)  # (B, nh, Tk, hs)
    v = v[:, :, None].expand(B, nkv, group, Tk, hs).reshape(B, nkv * group, Tk, hs)
    att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, Tq, Tk)
    if softcap:
        att = torch.tanh(att / softcap) * softcap
    if ctx.is_causal:
        future = torch.ones(q.shape[2], Tk, dtype=torch.bool, device=q.device).triu(1)
        att = att.masked_fill(future, float("-inf"))
    if ctx.mask is not None:
        att = att + ctx.mask
    if sinks is not None:
        sink = sinks.to(att.dtype).view(1, -1, 1, 1).expand(att.shape[0], -1, att.shape[2], 1)  # (B, nh, Tq, 1)
        att = torch.softmax(torch.cat((att, sink), dim=-1), dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
    else:
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
    return att @ v  # (B, nh, Tq, hs)


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q K^T scale) V for one query per row that sees every key (a decoding step): q (B, nh,
    1, hs), k and v (B, nkv, Tk, hs). The queries of a key group are the rows of one product, so the
    keys are neither copied per head nor masked. On a CPU in float32 these small products cost half
    of what scaled_dot_product_attention's kernel does at these sizes (in bfloat16, twice as much)."""
    B, nh, _, hs = q.shape
    nkv = k.shape[1]
    att = (q.view(B, nkv, nh // nkv, hs) @ k.transpose(-2, -1)) * scale  # (B, nkv, group, Tk)
    att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
    return (att @ v).view(B, nh, 1, hs)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with n_kv_head key/value heads and a per-layer KV cache."""

    examples = [
        {"window": 3},
        {"window": 1, "softcap": 5.0, "scale": 0.3},
        {"qk_norm": "head"},
        {"qk_norm": "full", "qkv_bias": True},
        {"sinks": True},
        {"window": 2, "sinks": True},
        {"output_gate": True, "qk_norm": "head"},
    ]
    """What the conformance kit runs besides the defaults: a window shorter than its sequences, and each feature."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        n_kv_head: int,
        head_dim: int,
        bias: bool,
        norm: Callable[[int], nn.Module] | None = None,
        window: int = 0,
        softcap: float = 0.0,
        scale: float = 0.0,
        qk_norm: str = "none",
        qkv_bias: bool = False,
        sinks: bool = False,
        output_gate: bool = False,
    ) -> None:
        super().__init__()
        problems = self.check(window=window, softcap=softcap, scale=scale, qk_norm=qk_norm)
        if problems:
            raise ValueError("; ".join(problems))
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.window, self.softcap, self.qk_norm = window, softcap, qk_norm
        self.scale = scale or 1.0 / math.sqrt(head_dim)
        self.output_gate = output_gate
        # Qwen3-Next / Qwen3.5's output gate: each head's query rows are followed by as many gate rows (their q_proj)
        q_rows = (2 if output_gate else 1) * n_head * head_dim
        self.c_attn = nn.Linear(d_model, q_rows + 2 * n_kv_head * head_dim, bias=bias or qkv_bias)
        self.c_proj = nn.Linear(n_head * head_dim, d_model, bias=bias)
        if qk_norm != "none":
            if norm is None:
                raise ValueError("qk_norm needs the norm builder the model passes (norm=)")
            q_dim, k_dim = (head_dim, head_dim) if qk_norm == "head" else (n_head * head_dim, n_kv_head * head_dim)
            self.q_norm, self.k_norm = norm(q_dim), norm(k_dim)
        self.sinks = nn.Parameter(torch.zeros(n_head)) if sinks else None  # (nh,) one sink logit per head

    @staticmethod
    def check(*, window: int = 0, softcap: float = 0.0, scale: float = 0.0, qk_norm: str = "none", **_: object):
        problems = []
        if window < 0:
            problems.append(f"window must be 0 (no window) or a number of keys >= 1, got {window}")
        if softcap < 0:
            problems.append(f"softcap must be 0 (off) or a positive number, got {softcap}")
        if scale < 0:
            problems.append(f"scale must be 0 (1/sqrt(head_dim)) or a positive number, got {scale}")
        if qk_norm not in QK_NORMS:
            problems.append(f"qk_norm must be one of {', '.join(map(repr, QK_NORMS))}, got {qk_norm!r}")
        return problems

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split(((2 if self.output_gate else 1) * nh * hs, nkv * hs, nkv * hs), dim=-1)
        if self.output_gate:  # (B, T, nh, 2, hs): each head's query, then its gate
            q, gate = q.view(B, T, nh, 2, hs).unbind(3)
            q = q.reshape(B, T, nh * hs)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if ctx.rotary is not None:
            q, k = ctx.rotary.apply(q, k)
        if self.window and (cache is not None or ctx.start + T > self.window):
            y = self.attend_window(q, k, v, ctx, cache)
        else:
            if cache is not None:
                k, v = cache.update(k, v, ctx.start)  # (B, nkv, start + T, hs)
            y = self.attend(q, k, v, ctx)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, nh * hs)
        if self.output_gate:
            y = y * torch.sigmoid(gate.reshape(B, T, nh * hs))
        return self.c_proj(y)

    def attend_window(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, cache: LayerKVCache | None
    ) -> Tensor:
        """Sliding-window attention of this pass's queries over the keys its cache holds and its own,
        in blocks of at most ``window`` queries; the cache keeps the last ``window`` keys after."""
        start, T = ctx.start, q.shape[2]
        first = start
        if isinstance(cache, WindowKVCache):
            old_k, old_v, first = cache.recent(start)
            cache.write(k, v, start)
            k, v = torch.cat((old_k, k), dim=2), torch.cat((old_v, v), dim=2)
        elif cache is not None:  # a cache that keeps every key (one made by hand)
            k, v = cache.update(k, v, start)
            first = 0
        outputs = []
        for queries, keys in window_blocks(start, T, self.window, first):
            mask = window_mask(ctx, queries, keys, self.window, q.dtype)
            block = dataclasses.replace(ctx, mask=mask, is_causal=False)
            qs, ks = slice(queries.start - start, queries.stop - start), slice(keys.start - first, keys.stop - first)
            outputs.append(self.attend(q[:, :, qs], k[:, :, ks], v[:, :, ks], block))
        return torch.cat(outputs, dim=2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """q (B, nh, Tq, hs), k and v (B, nkv, Tk, hs) -> (B, nh, Tq, hs)."""
        if self.softcap or self.sinks is not None:
            return explicit_attention(q, k, v, ctx, self.scale, self.softcap, self.sinks)
        if q.shape[2] == 1 and ctx.mask is None and q.device.type == "cpu" and q.dtype == torch.float32:
            return one_query_attention(q, k, v, self.scale)
        return scaled_dot_product_attention(
            q, k, v, attn_mask=ctx.mask, is_causal=ctx.is_causal, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1]
        )

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LayerKVCache:
        if self.window:
            return WindowKVCache(
                batch_size, self.n_kv_head, max_len, self.head_dim, self.window, device=device, dtype=dtype
            )
        return LayerKVCache(batch_size, self.n_kv_head, max_len, self.head_dim, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        held = min(self.window, max_len) if self.window else max_len
        return 2 * batch_size * self.n_kv_head * held * self.head_dim * dtype.itemsize

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n_tokens = batch * seq_len
        # Q K^T and att @ V: 2 matmuls of (Tq x hs) by (hs x Tk) per head, the full rectangle each block
        # computes (no causal halving); without a window, or up to BLOCK_WINDOWS x window tokens, T x T.
        blocks = window_blocks(0, seq_len, self.window) if self.window else [(range(seq_len), range(seq_len))]
        pairs = sum(len(qs) * len(ks) for qs, ks in blocks)
        scores = 2 * 2 * batch * self.n_head * pairs * self.head_dim
        return {"attention projections": linear_flops(n_tokens, self.c_attn, self.c_proj), "attention scores": scores}


class EagerSelfAttention(CausalSelfAttention):
    """Causal self-attention computed explicitly: softmax(QK^T/sqrt(d_k) + M)V."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        return explicit_attention(q, k, v, ctx, self.scale, self.softcap, self.sinks)


class SlidingWindowAttention(CausalSelfAttention):
    """Sliding-window causal self-attention: each query sees its last ``window`` keys; the cache keeps only those."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        n_kv_head: int,
        head_dim: int,
        bias: bool,
        norm: Callable[[int], nn.Module] | None = None,
        window: int = 4096,
        softcap: float = 0.0,
        scale: float = 0.0,
        qk_norm: str = "none",
        qkv_bias: bool = False,
        sinks: bool = False,
        output_gate: bool = False,
    ) -> None:  # the parent's constructor runs this class's check, which refuses window < 1
        super().__init__(
            d_model,
            n_head,
            n_kv_head=n_kv_head,
            head_dim=head_dim,
            bias=bias,
            norm=norm,
            window=window,
            softcap=softcap,
            scale=scale,
            qk_norm=qk_norm,
            qkv_bias=qkv_bias,
            sinks=sinks,
            output_gate=output_gate,
        )

    @staticmethod
    def check(*, window: int = 4096, **params: object) -> list[str]:
        if window < 1:
            return [f"window must be a number of keys >= 1, got {window}"]
        return CausalSelfAttention.check(window=window, **params)

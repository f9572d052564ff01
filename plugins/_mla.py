"""Multi-head latent attention (MLA; DeepSeek-AI, 2024, "DeepSeek-V2", section 2.1; transformers 5.x's
DeepseekV2Attention and DeepseekV3Attention are the reference).

Keys and values of every head come from one latent per token: ``kv_a`` projects x to a latent of
``kv_rank`` features (normalized by ``kv_norm``) and a rotary key of ``head_dim`` features shared by all
heads; ``kv_b`` expands the latent into each head's non-rotary key (``nope_dim``) and value (``v_dim``).
Queries come from x directly (``q``) or through a low-rank bottleneck (``q_rank`` > 0: ``q_a``, its norm
``q_norm``, ``q_b``), each head's ``nope_dim`` features then its ``head_dim`` rotary ones. The recipe's
``head_dim`` is the rotary width (as DeepSeek's config.json sets head_dim = qk_rope_head_dim), so the
position encoding rotates exactly those features; a head's queries and keys are nope_dim + head_dim wide.

The cache holds, per token, the normalized latent and the rotated key: kv_rank + head_dim values, against
MHA's 2 x n_head x head width (DeepSeek-V2: 576 against 32,768). A pass of several tokens expands the
latents it attends to with ``kv_b``, as transformers does. A decoding step (one new token on a cache) uses
the absorbed form instead (DeepSeek-V2, section 2.1.2): kv_b's key half folded into the query and its value
half applied after the weighted sum, so the step reads each cached latent twice and expands none of them
(DeepSeek-V2-Lite at 4,096 cached tokens: 0.17 GFLOP a layer against 17.2). It computes the same products in
another order: cached decoding equals the full forward within float32 rounding.

- ``rope_interleave``: the rotary features are stored as interleaved pairs (x0, x1), (x2, x3), ... (DeepSeek-V2
  always, V3 as its rope_interleave says); they are de-interleaved into the rotate-half order before the
  rotation, which gives transformers' products exactly (its interleaved rotation writes the same order).
- ``scale``: the softmax scale instead of 1/sqrt(nope_dim + head_dim) (DeepSeek with YaRN multiplies it
  by mscale(factor, mscale_all_dim)^2).
- ``bias``: biases on ``q_a`` (or ``q``), ``kv_a`` and ``c_proj``, DeepSeek's attention_bias; ``q_b`` and
  ``kv_b`` have none.
- ``latent_eps``: the epsilon of the latent norms (``q_norm``, ``kv_norm``), the layer's norm built with it;
  0 keeps the layer's norm as it is (Kimi Linear's latent norms use 1e-6 beside model norms of 1e-5).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import AttentionContext
from gptzoo.model.sdpa import scaled_dot_product_attention


class LatentKVCache:
    """The cache of a latent attention: each token's latent (B, max_len, kv_rank) and its rotated key
    (B, 1, max_len, head_dim), shared by the heads."""

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        kv_rank: int,
        rope_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.latent = torch.empty(batch_size, max_len, kv_rank, device=device, dtype=dtype)
        self.k_rope = torch.empty(batch_size, 1, max_len, rope_dim, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.latent.shape[1]

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes + self.k_rope.nbytes

    def update(self, latent: Tensor, k_rope: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Write latent (B, T, c) and k_rope (B, 1, T, r) at positions start..start+T; return all so far."""
        end = start + latent.shape[1]
        self.latent[:, start:end] = latent
        self.k_rope[:, :, start:end] = k_rope
        return self.latent[:, :end], self.k_rope[:, :, :end]


def widths(head_dim: int, kv_rank: int = 0, nope_dim: int = 0, v_dim: int = 0) -> tuple[int, int, int]:
    """kv_rank, nope_dim and v_dim with their defaults for 0: 4, 2 and 2 x head_dim (the rotary width)."""
    return kv_rank or 4 * head_dim, nope_dim or 2 * head_dim, v_dim or 2 * head_dim


def deinterleave(x: Tensor) -> Tensor:
    """Pairs (x0, x1), (x2, x3), ... -> (x0, x2, ..., x1, x3, ...): the rotate-half order of the same rotation."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class LatentAttention(nn.Module):
    """Multi-head latent attention: keys and values expanded from a cached per-token latent (DeepSeek-V2/V3)."""

    examples = [
        {"kv_rank": 12, "nope_dim": 8, "v_dim": 6},
        {"kv_rank": 10, "q_rank": 14, "nope_dim": 4, "v_dim": 12, "rope_interleave": True, "scale": 0.2},
    ]
    """What the conformance kit runs besides the defaults: v wider and narrower than q and k, a query
    bottleneck, interleaved rotary features, another scale."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        n_kv_head: int,
        head_dim: int,
        bias: bool,
        norm: Callable[[int], nn.Module],
        kv_rank: int = 0,
        q_rank: int = 0,
        nope_dim: int = 0,
        v_dim: int = 0,
        rope_interleave: bool = False,
        scale: float = 0.0,
        latent_eps: float = 0.0,
    ) -> None:
        super().__init__()
        problems = self.check(
            d_model=d_model,
            n_head=n_head,
            n_kv_head=n_kv_head,
            head_dim=head_dim,
            kv_rank=kv_rank,
            q_rank=q_rank,
            nope_dim=nope_dim,
            v_dim=v_dim,
            scale=scale,
        )
        if problems:
            raise ValueError("; ".join(problems))
        self.n_head, self.rope_dim, self.q_rank = n_head, head_dim, q_rank
        self.kv_rank, self.nope_dim, self.v_dim = widths(head_dim, kv_rank, nope_dim, v_dim)
        self.rope_interleave = rope_interleave
        self.scale = scale or 1.0 / math.sqrt(self.nope_dim + head_dim)
        if latent_eps:  # the latent norms' own epsilon (Kimi Linear's 1e-6 beside its model norms' 1e-5)
            norm = functools.partial(norm, eps=latent_eps)
        qk = n_head * (self.nope_dim + head_dim)
        if q_rank:
            self.q_a = nn.Linear(d_model, q_rank, bias=bias)
            self.q_norm = norm(q_rank)
            self.q_b = nn.Linear(q_rank, qk, bias=False)
        else:
            self.q = nn.Linear(d_model, qk, bias=bias)
        self.kv_a = nn.Linear(d_model, self.kv_rank + head_dim, bias=bias)
        self.kv_norm = norm(self.kv_rank)
        self.kv_b = nn.Linear(self.kv_rank, n_head * (self.nope_dim + self.v_dim), bias=False)
        self.c_proj = nn.Linear(n_head * self.v_dim, d_model, bias=bias)

    @staticmethod
    def check(
        *,
        d_model: int = 0,
        n_head: int = 1,
        n_kv_head: int = 1,
        head_dim: int = 2,
        kv_rank: int = 0,
        q_rank: int = 0,
        nope_dim: int = 0,
        v_dim: int = 0,
        scale: float = 0.0,
        **_: object,
    ) -> list[str]:
        problems = []
        if n_kv_head != n_head:
            problems.append(
                f"mla expands its latent into every head's keys and values: n_kv_head must equal n_head ({n_head}), "
                f"got {n_kv_head}"
            )
        if head_dim % 2:
            problems.append(f"head_dim is mla's rotary width and must be even, got {head_dim}")
        for name, value in (("kv_rank", widths(head_dim, kv_rank)[0]), ("q_rank", q_rank)):
            if value < 0 or (d_model and value > d_model):
                problems.append(
                    f"{name} must be between 0 and the width n_embd ({d_model}) (a latent compresses x), got {value}"
                )
        if nope_dim < 0 or v_dim < 0:
            problems.append(f"nope_dim and v_dim must be >= 0 (0: 2 x head_dim), got {nope_dim} and {v_dim}")
        if scale < 0:
            problems.append(f"scale must be 0 (1/sqrt(nope_dim + head_dim)) or a positive number, got {scale}")
        return problems

    def queries(self, x: Tensor) -> Tensor:
        """x (B, T, d) -> every head's queries, flat (B, T, nh (nope_dim + head_dim))."""
        return self.q_b(self.q_norm(self.q_a(x))) if self.q_rank else self.q(x)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LatentKVCache | None = None) -> Tensor:
        B, T, _ = x.shape
        nh, n, r, v = self.n_head, self.nope_dim, self.rope_dim, self.v_dim
        q = self.queries(x).view(B, T, nh, n + r).transpose(1, 2)  # (B, nh, T, n + r)
        q_nope, q_rope = q.split((n, r), dim=-1)
        latent, k_rope = self.kv_a(x).split((self.kv_rank, r), dim=-1)  # (B, T, c), (B, T, r)
        latent, k_rope = self.kv_norm(latent), k_rope[:, None]  # (B, T, c), (B, 1, T, r)
        if self.rope_interleave:
            q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
        if ctx.rotary is not None:
            q_rope, k_rope = ctx.rotary.apply(q_rope, k_rope)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope, ctx.start)  # every token so far: (B, S, c), (B, 1, S, r)
        if cache is not None and T == 1:
            y = self.absorbed(q_nope, q_rope, latent, k_rope, ctx.mask)
        else:
            y = self.expanded(q_nope, q_rope, latent, k_rope, ctx)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * v))  # y: (B, nh, T, v)

    def expanded(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, ctx: AttentionContext) -> Tensor:
        """Attention over every latent expanded by kv_b into each head's keys and values (as transformers
        computes it): q_nope (B, nh, T, n), q_rope (B, nh, T, r), latent (B, S, c), k_rope (B, 1, S, r)
        -> (B, nh, T, v)."""
        (B, S, _), nh, n, r, v = latent.shape, self.n_head, self.nope_dim, self.rope_dim, self.v_dim
        k_nope, values = self.kv_b(latent).view(B, S, nh, n + v).transpose(1, 2).split((n, v), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(B, nh, S, r)), dim=-1)  # (B, nh, S, n + r)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, nh, T, n + r)
        return scaled_dot_product_attention(q, k, values, attn_mask=ctx.mask, is_causal=ctx.is_causal, scale=self.scale)

    def absorbed(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, mask: Tensor | None) -> Tensor:
        """Attention of one query per row over every cached latent without expanding them: q_nope (B, nh,
        1, n), q_rope (B, nh, 1, r), latent (B, S, c), k_rope (B, 1, S, r), mask (B or 1, nh or 1, 1, S)
        -> (B, nh, 1, v). Heads are rows of one product per sequence, so no latent is copied per head."""
        B, nh = q_nope.shape[:2]
        w = self.kv_b.weight.view(nh, self.nope_dim + self.v_dim, self.kv_rank)  # (nh, n + v, c)
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w[:, : self.nope_dim])  # (B, nh, 1, c)
        att = q_latent.view(B, nh, -1) @ latent.transpose(1, 2) + q_rope.view(B, nh, -1) @ k_rope[:, 0].transpose(1, 2)
        att = att.view(B, nh, 1, -1) * self.scale  # (B, nh, 1, S)
        if mask is not None:
            att = att + mask
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q_nope.dtype)
        out = (att.view(B, nh, -1) @ latent).view(B, nh, 1, self.kv_rank)  # (B, nh, 1, c)
        return torch.einsum("bhtc,hvc->bhtv", out, w[:, self.nope_dim :])  # (B, nh, 1, v)

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> LatentKVCache:
        return LatentKVCache(batch_size, max_len, self.kv_rank, self.rope_dim, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        return batch_size * max_len * (self.kv_rank + self.rope_dim) * dtype.itemsize

    def _query_flops(self, n_tokens: int) -> int:
        return linear_flops(n_tokens, self.q_a, self.q_b) if self.q_rank else linear_flops(n_tokens, self.q)

    def _score_flops(self, n_queries: int, n_keys: int) -> int:
        """Q K^T and att V over every (query, key) pair of each head: the full rectangle."""
        return 2 * self.n_head * n_queries * n_keys * (self.nope_dim + self.rope_dim + self.v_dim)

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n = batch * seq_len
        projections = self._query_flops(n) + linear_flops(n, self.kv_a, self.kv_b, self.c_proj)
        return {"attention projections": projections, "attention scores": batch * self._score_flops(seq_len, seq_len)}

    def decode_cost(self, cache_len: int, dtype: torch.dtype) -> dict[str, int]:
        keys, nh, c = cache_len + 1, self.n_head, self.kv_rank  # the absorbed step: kv_b folded, no latent expanded
        absorbed = 2 * nh * c * (self.nope_dim + self.v_dim) + 2 * nh * keys * (2 * c + self.rope_dim)
        flops = self._query_flops(1) + linear_flops(1, self.kv_a, self.c_proj) + absorbed
        weights = sum(p.numel() for p in self.parameters()) * dtype.itemsize
        return {"flops": flops, "bytes": weights + self.kv_bytes(1, cache_len, dtype)}

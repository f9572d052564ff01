r"""The model: token embedding, position encoding, N blocks, final norm, LM head.

It is composed from component modules built elsewhere (gptzoo.model.build) and calls only their
interfaces (gptzoo.interfaces): no component names, no flags. The one structural choice, norm
placement, selects a block class.

Dimensions: B batch, T new tokens, S all keys so far (cached + new), V vocab_size, d n_embd,
nh n_head, nkv n_kv_head, hs head_dim.

    idx (B, T) -> wte -> x (B, T, d) [+ position.embed]
      -> blocks x n_layer -> ln_f -> lm_head -> logits (B, T, V)

    pre (GPT-2, Radford et al., 2019)         post (Vaswani et al., 2017)
      x ----------+--> (+) ---+--> (+) -->      x --+--> (+) -> ln_1 --+--> (+) -> ln_2 -->
       \ ln_1 > attn /  \ ln_2 > mlp /            \  attn  /          \  mlp  /
      then a final ln_f                         no final norm
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.interfaces import AttentionContext, KVCache, LayerKVCache, Position, Positions

if TYPE_CHECKING:
    from gptzoo.recipe import Recipe


class PreNormBlock(nn.Module):
    has_final_norm = True

    def __init__(self, ln_1: nn.Module, attn: nn.Module, ln_2: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = ln_1, attn, ln_2, mlp

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), ctx, cache)
        return x + self.mlp(self.ln_2(x))


class PostNormBlock(PreNormBlock):
    has_final_norm = False

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = self.ln_1(x + self.attn(x, ctx, cache))
        return self.ln_2(x + self.mlp(x))


BLOCKS: dict[str, type[PreNormBlock]] = {"pre": PreNormBlock, "post": PostNormBlock}
"""norm_placement -> block class."""


class GPT(nn.Module):
    """A decoder-only language model: token ids (B, T) -> logits (B, T, vocab_size)."""

    recipe: Recipe | None = None
    """The recipe it was built from (set by gptzoo.build_model)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        n_embd: int,
        position: Position,
        blocks: list[PreNormBlock],
        ln_f: nn.Module,
        tie_embeddings: bool,
    ) -> None:
        super().__init__()
        # An explicit empty weight skips nn.Embedding's own init (init_weights does it), which on the
        # meta device would cost seconds of lazy imports for normal_.
        self.wte = nn.Embedding(vocab_size, n_embd, _weight=torch.empty(vocab_size, n_embd))
        self.position = position
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = ln_f
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.wte.weight

    @property
    def tied(self) -> bool:
        return self.lm_head.weight is self.wte.weight

    def forward(
        self,
        idx: Tensor,
        cache: KVCache | None = None,
        *,
        attention_mask: Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> Tensor:
        """idx (B, T) long -> logits (B, T, V). With a cache, idx continues the cached sequence.

        attention_mask (B, T), for the first call only: 1 for tokens, 0 for left padding, so rows of
        different lengths share a batch; each row's tokens get positions 0, 1, ... and never see
        another row's padding. A cache remembers it for the calls that follow.

        logits_to_keep: compute the logits of only the last this many positions (B, n, V), as a
        prefill that needs just the next token does; 0 keeps all.
        """
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        end = start + T
        limit = self.position.max_positions
        if limit is not None and end > limit:
            raise GptzooError(
                f"a sequence of {end} tokens is longer than the {limit} positions that "
                f"{type(self.position).__name__} encodes; shorten the input"
            )
        if cache is not None and end > cache.max_len:
            raise GptzooError(
                f"the KV cache holds {cache.max_len} positions, {end} were asked for; make a larger cache"
            )
        if attention_mask is not None and attention_mask.shape != idx.shape:
            raise GptzooError(f"attention_mask has shape {tuple(attention_mask.shape)}, the tokens {tuple(idx.shape)}")
        if cache is not None:
            pos = cache.advance(T, attention_mask, idx.device)
        elif attention_mask is not None:
            pos = Positions.padded(attention_mask)
        else:
            pos = Positions.plain(0, T, idx.device)
        x = self.wte(idx)  # (B, T, d)
        emb = self.position.embed(pos.queries)
        if emb is not None:
            x = x + emb.to(x.dtype)
        ctx = self.attention_context(pos, x.dtype)
        for i, block in enumerate(self.blocks):
            x = block(x, ctx, cache.layers[i] if cache is not None else None)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(self.ln_f(x))

    def attention_context(self, pos: Positions, dtype: torch.dtype) -> AttentionContext:
        """Rotary tables and masks for these queries, computed once for all layers; the context also
        carries the positions and the position bias, for a layer that keeps only some keys."""
        start, T = pos.start, pos.queries.shape[1]
        device = pos.queries.device
        rotary = self.position.rotary(pos.queries)
        bias = self.position.attn_bias(pos.queries, pos.keys)
        shared = {"positions": pos, "attn_bias": self.position.attn_bias}
        if bias is None and pos.key_mask is None and start == 0:
            return AttentionContext(start, rotary, None, is_causal=True, **shared)
        if bias is None and pos.key_mask is None and T == 1:  # one new token sees every cached key
            return AttentionContext(start, rotary, None, is_causal=False, **shared)
        q_index = torch.arange(start, start + T, device=device)[:, None]
        k_index = torch.arange(0, start + T, device=device)[None, :]
        allowed = k_index <= q_index  # (T, S): causal
        if pos.key_mask is not None:
            # never a padding key; a padding query sees itself, so that no row is all -inf (NaN)
            allowed = (allowed & pos.key_mask[:, None, :]) | (k_index == q_index)  # (B, T, S)
            allowed = allowed[:, None]  # (B, 1, T, S)
        mask = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
        if bias is not None:
            mask = mask + bias  # (B or 1, nh, T, S)
        return AttentionContext(start, rotary, mask.to(dtype), is_causal=False, **shared)

    def load_weights(self, state: dict[str, Tensor], *, source: str) -> None:
        """Adopt these tensors as the weights (no copy), keep a tied head tied, and insist that
        nothing is left on the meta device."""
        tied = self.tied
        self.load_state_dict(state, strict=False, assign=True)
        if tied:
            self.lm_head.weight = self.wte.weight
        left = [name for name, t in (*self.named_parameters(), *self.named_buffers()) if t.is_meta]
        if left:
            raise CheckpointError(f"{source}: nothing loaded into {left}; every tensor of the model needs a weight")

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """GPT-2 initialization: normal(0, std) for linear and embedding weights, zero biases, and
        std / sqrt(2 n_layer) for the projections that write into the residual stream."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        residual_std = std / math.sqrt(2 * len(self.blocks))
        for block in self.blocks:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """A KV cache for ``batch_size`` sequences of up to ``max_len`` tokens (prompt + new)."""
        ref = self.wte.weight
        device = ref.device if device is None else device
        dtype = ref.dtype if dtype is None else dtype
        return KVCache([b.attn.init_cache(batch_size, max_len, device=device, dtype=dtype) for b in self.blocks])

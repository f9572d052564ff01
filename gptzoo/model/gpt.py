r"""The model: token embedding, position encoding, N blocks, final norm, LM head.

It is composed from component modules built elsewhere (gptzoo.model.build) and calls only their
interfaces (gptzoo.interfaces): no component names, no flags. The recipe's structural choices select
a block class (``norm_placement``) and, per layer, the components and position encoding its layer
type uses (``layer_pattern``); the model only runs what it was given.

Dimensions: B batch, T new tokens, S all keys so far (cached + new), V vocab_size, d n_embd,
nh n_head, nkv n_kv_head, hs head_dim.

    idx (B, T) -> wte [x sqrt(d)] -> x (B, T, d) [+ position.embed]
      -> blocks x n_layer -> ln_f -> lm_head [-> c tanh(./c)] -> logits (B, T, V)

    pre (GPT-2, Radford et al., 2019)         post (Vaswani et al., 2017)
      x ----------+--> (+) ---+--> (+) -->      x --+--> (+) -> ln_1 --+--> (+) -> ln_2 -->
       \ ln_1 > attn /  \ ln_2 > mlp /            \  attn  /          \  mlp  /

    sandwich (a norm on each side)            reordered (a norm after each sublayer)
      x --------------------+--> (+) ...        x ------------+--> (+) ...
       \ ln_1 > attn > post_ln_1 /               \ attn > ln_1 /        (mlp likewise, ln_2)
       (mlp likewise: ln_2, post_ln_2)

    parallel (both sublayers read the block's input)
      x ---------------------------+--> (+) -->
       \ ln_1 > attn + ln_2 > mlp /

    every shape but post ends with a final norm ln_f.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn

from gptzoo.compat import takes_no_arguments
from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.interfaces import AttentionContext, LayerKVCache, Position, Positions
from gptzoo.model.kv_cache import KVCache

if TYPE_CHECKING:
    from gptzoo.recipe import Recipe
    from gptzoo.registry import Registry


class PreNormBlock(nn.Module):
    layout: ClassVar[tuple[str, ...]] = ("ln_1", "attn", "ln_2", "mlp")
    """The block's parts in the order they run (and are registered, which fixes the order in which
    initialization draws random numbers); every part but attn and mlp is a norm."""
    has_final_norm: ClassVar[bool] = True

    def __init__(self, attn: nn.Module, mlp: nn.Module, residual_multiplier: float = 1.0, **norms: nn.Module) -> None:
        super().__init__()
        if set(norms) != set(self.norms()):
            raise TypeError(f"{type(self).__name__} takes the norms {self.norms()}, got {tuple(norms)}")
        parts = {"attn": attn, "mlp": mlp, **norms}
        for name in self.layout:
            setattr(self, name, parts[name])
        self.residual_multiplier = residual_multiplier
        """Each sublayer's output is scaled by this before the residual stream adds it (Granite; 1: as it is)."""

    def scaled(self, y: Tensor) -> Tensor:
        """A sublayer's output as the residual stream adds it."""
        return y if self.residual_multiplier == 1.0 else y * self.residual_multiplier

    @classmethod
    def norms(cls) -> tuple[str, ...]:
        """The names of the block's norms, which the builder makes."""
        return tuple(name for name in cls.layout if name not in ("attn", "mlp"))

    def parts(self) -> list[nn.Module]:
        """The components of the block, in its layout's order."""
        return [getattr(self, name) for name in self.layout]

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = x + self.scaled(self.attn(self.ln_1(x), ctx, cache))
        return x + self.scaled(self.mlp(self.ln_2(x)))


class PostNormBlock(PreNormBlock):
    has_final_norm = False

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = self.ln_1(x + self.scaled(self.attn(x, ctx, cache)))
        return self.ln_2(x + self.scaled(self.mlp(x)))


class SandwichBlock(PreNormBlock):
    layout = ("ln_1", "attn", "post_ln_1", "ln_2", "mlp", "post_ln_2")

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = x + self.scaled(self.post_ln_1(self.attn(self.ln_1(x), ctx, cache)))
        return x + self.scaled(self.post_ln_2(self.mlp(self.ln_2(x))))


class ReorderedBlock(PreNormBlock):
    layout = ("attn", "ln_1", "mlp", "ln_2")

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        x = x + self.scaled(self.ln_1(self.attn(x, ctx, cache)))
        return x + self.scaled(self.ln_2(self.mlp(x)))


class ParallelBlock(PreNormBlock):
    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerKVCache | None = None) -> Tensor:
        attn = self.scaled(self.attn(self.ln_1(x), ctx, cache))
        return self.scaled(self.mlp(self.ln_2(x))) + attn + x


def _resets_itself(module: nn.Module) -> bool:
    return callable(getattr(module, "reset_parameters", None))


def _residual_projections(part: nn.Module) -> list[nn.Linear]:
    """The linears of an attention or mlp that write into the residual stream: its ``c_proj``; for an
    mlp without one (a mixture of experts), the ``c_proj`` of each module inside it that has one."""
    own = getattr(part, "c_proj", None)
    if own is not None:
        return [own]
    found = (getattr(module, "c_proj", None) for module in part.modules())
    return [projection for projection in found if isinstance(projection, nn.Linear)]


def _modules_outside(
    root: nn.Module, own: set[int], reset: Callable[[nn.Module], None], seen: set[int] | None = None
) -> Iterator[nn.Module]:
    """``root.modules()`` in its order (each module once), except that a module in ``own`` is reset
    where it first comes and neither it nor anything inside it is yielded."""
    seen = set() if seen is None else seen
    if id(root) in seen:
        return
    seen.add(id(root))
    if id(root) in own:
        reset(root)
        return
    yield root
    for child in root.children():
        yield from _modules_outside(child, own, reset, seen)


BLOCKS: dict[str, type[PreNormBlock]] = {
    "pre": PreNormBlock,
    "post": PostNormBlock,
    "sandwich": SandwichBlock,
    "reordered": ReorderedBlock,
    "parallel": ParallelBlock,
}
"""norm_placement -> block class."""


@dataclass(frozen=True)
class PositionLimit:
    """The longest sequence a model can run: what the position encoding that encodes the fewest
    positions (its ``max_positions``) encodes, and that encoding's class name."""

    positions: int
    encoding: str

    def __str__(self) -> str:
        return f"the {self.positions} positions that {self.encoding} encodes"


class GPT(nn.Module):
    """A decoder-only language model: token ids (B, T) -> logits (B, T, vocab_size)."""

    recipe: Recipe | None = None
    """The recipe it was built from (set by gptzoo.build_model)."""
    registry: Registry | None = None
    """The registry it was built from (set by gptzoo.build_model): what else its plugins provide, such
    as the lowerings of their components for CPU decoding (gptzoo.inference.lowerings)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        n_embd: int,
        position: Position,
        blocks: list[PreNormBlock],
        ln_f: nn.Module,
        tie_embeddings: bool,
        layer_positions: Sequence[Position] = (),
        position_of: Sequence[int] = (),
        scale_embeddings: bool = False,
        logit_softcap: float = 0.0,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
    ) -> None:
        """``layer_positions``: position encodings that some layers use instead of ``position`` for
        their rotary and bias (a layer type's); ``position_of[i]``: block i's, 0 for ``position``, k
        for ``layer_positions[k - 1]`` (default: all 0). Only ``position`` adds an embedding."""
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
        self.layer_positions = nn.ModuleList(layer_positions)
        self.position_of = tuple(position_of) or (0,) * len(blocks)
        self.embed_scale = (
            math.sqrt(n_embd) if scale_embeddings else embedding_multiplier if embedding_multiplier != 1.0 else None
        )
        self.logit_softcap = logit_softcap
        self.logits_scaling = logits_scaling

    @property
    def positions(self) -> list[Position]:
        """The model's position encoding, then those of layer types."""
        return [self.position, *self.layer_positions]

    @property
    def position_limit(self) -> PositionLimit | None:
        """The hard limit on a sequence's length (prompt and new tokens, or an evaluation window),
        which every command holds to: the fewest positions any of the model's position encodings
        encodes; None where each takes any length (RoPE, ALiBi)."""
        limits = [(p.max_positions, type(p).__name__) for p in self.positions if p.max_positions is not None]
        return PositionLimit(*min(limits)) if limits else None

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can run (:attr:`position_limit`); None: any length."""
        limit = self.position_limit
        return limit.positions if limit is not None else None

    @property
    def context_length(self) -> int | None:
        """The context the model was trained at: its recipe's context_length (without a recipe,
        :attr:`max_positions`). A sequence past it, within :attr:`max_positions`, runs, with the
        warning :meth:`past_context`."""
        return self.recipe.model.context_length if self.recipe is not None else self.max_positions

    def too_long(self, length: int, what: str, fix: str) -> str | None:
        """Why a sequence of ``length`` tokens (``what``, e.g. "a prompt of 200 tokens") cannot run,
        ending with ``fix``; None when it fits :attr:`position_limit`."""
        limit = self.position_limit
        return f"{what} is longer than {limit}; {fix}" if limit is not None and length > limit.positions else None

    def check_length(self, length: int, what: str, fix: str) -> None:
        """Raise :meth:`too_long`'s reason as a GptzooError when a sequence of ``length`` tokens cannot run."""
        refused = self.too_long(length, what, fix)
        if refused is not None:
            raise GptzooError(refused)

    def past_context(self, length: int) -> str | None:
        """The one warning for sequences of ``length`` tokens past :attr:`context_length` (which the
        positions still encode); None within it."""
        context = self.context_length
        if context is None or length <= context:
            return None
        limit = self.max_positions
        reach = "any length" if limit is None else f"up to {limit}"
        return (
            f"sequences of {length} tokens are longer than the context length {context} the model was trained at: "
            f"its positions encode {reach}, so they run, but expect worse results past {context} tokens"
        )

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
        self.check_length(end, f"a sequence of {end} tokens", "shorten the input")
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
        if self.embed_scale is not None:  # rounded to the embeddings' dtype first
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        emb = self.position.embed(pos.queries)
        if emb is not None:
            x = x + emb.to(x.dtype)
        contexts = [self.attention_context(pos, x.dtype, position) for position in self.positions]
        for i, block in enumerate(self.blocks):
            x = block(x, contexts[self.position_of[i]], cache.layers[i] if cache is not None else None)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(self.ln_f(x))
        if self.logits_scaling != 1.0:
            logits = logits / self.logits_scaling
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def attention_context(
        self, pos: Positions, dtype: torch.dtype, position: Position | None = None
    ) -> AttentionContext:
        """Rotary tables and masks for these queries from ``position`` (default: the model's),
        computed once for all layers that use it; the context also carries the positions and the
        position bias, for a layer that keeps only some keys."""
        position = self.position if position is None else position
        start, T = pos.start, pos.queries.shape[1]
        device = pos.queries.device
        rotary = position.rotary(pos.queries)
        bias = position.attn_bias(pos.queries, pos.keys)
        shared = {"positions": pos, "attn_bias": position.attn_bias}
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

    def declaring(self, member: str) -> list[nn.Module]:
        """The modules of the model (itself aside) with a callable ``member``: the components that
        declare one of the contract's optional members (``flops``, ``active_parameters``, ``aux_losses``)."""
        return [m for m in self.modules() if m is not self and callable(getattr(m, member, None))]

    def aux_losses(self) -> dict[str, Tensor]:
        """The auxiliary losses of the latest forward by name (a router's load balancing): the mean over
        the components that report one of that name (their ``aux_losses``); empty when none does."""
        found: dict[str, list[Tensor]] = {}
        for module in self.declaring("aux_losses"):
            for name, loss in module.aux_losses().items():
                found.setdefault(name, []).append(loss)
        return {name: torch.stack(losses).mean() for name, losses in found.items()}

    def stat_reporters(self) -> dict[str, nn.Module]:
        """The modules that report statistics (contract 5: a ``stats()`` that takes no arguments), by their
        path in the model (``blocks.3.mlp``); a ``stats`` that takes arguments is some other method."""
        found = {}
        for path, module in self.named_modules():
            member = getattr(module, "stats", None)
            if module is not self and callable(member) and takes_no_arguments(member):
                found[path] = module
        return found

    def components(self) -> list[nn.Module]:
        """The model's parts that factories built: the positions, each block's norms, attention and
        mlp, and the final norm (components nested in these, such as an mlp's activation, are known
        to the builder only)."""
        blocks = [part for b in self.blocks for part in b.parts()]
        return [*self.positions, *blocks, self.ln_f]

    @torch.no_grad()
    def init_weights(
        self,
        std: float = 0.02,
        *,
        components: Sequence[nn.Module] | None = None,
        reset: Callable[[nn.Module], None] | None = None,
    ) -> None:
        """Initialize every weight: each component that initializes itself, GPT-2's rule for the rest.

        A component (what a factory built: ``components``, by default :meth:`components`; the
        builder also passes the nested ones, such as an mlp's activation) that has a
        ``reset_parameters()`` method, its own or inherited from a torch module (a norm subclassing
        nn.LayerNorm), is reset by it (through ``reset``, which the builder runs under the plugin's
        name) and left whole: nothing below initializes any of its tensors. Everything else gets
        GPT-2's initialization, in the order of ``modules()``: normal(0, std) for the weights of
        nn.Linear and nn.Embedding layers (the token embedding, and the tied head with it), zeros for
        their biases, then normal(0, std / sqrt(2 n_layer)) for the ``c_proj`` weight of each
        attention and mlp without ``reset_parameters`` (of each expert of an mlp without one of its
        own): the projections that write into the residual stream (GPT-2's residual scaling). Other
        tensors (a norm's weight and bias) keep what their constructor gave them. No built-in component
        has ``reset_parameters``, so built-in models draw exactly GPT-2's random numbers.
        """
        reset = reset if reset is not None else (lambda module: module.reset_parameters())
        own = {id(m) for m in (components if components is not None else self.components()) if _resets_itself(m)}
        for module in _modules_outside(self, own, reset):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        residual_std = std / math.sqrt(2 * len(self.blocks))
        for block in self.blocks:
            for part in (block.attn, block.mlp):
                if id(part) not in own:
                    for projection in _residual_projections(part):
                        nn.init.normal_(projection.weight, mean=0.0, std=residual_std)

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

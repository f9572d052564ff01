"""Hook specifications: one per component kind. Each docstring is that kind's contract.

A plugin implements any of these hooks and calls ``register`` once per component::

    import gptzoo

    @gptzoo.hookimpl
    def register_norms(register):
        register("rmsnorm", RMSNorm)

``register(name, factory, *, doc=None, override=False)``:
    name: the registry key recipes use; names match exactly.
    factory: a callable; its signature is the kind's contract below. Every keyword parameter
        beyond the structural ones must have a default: recipe parameters are passed by name and
        validated against this signature, and contract tests build each component with defaults.
    doc: one line for listings; defaults to the first line of the factory's docstring.
    override: replace an entry of the same name registered by an earlier plugin (built-ins come
        first). Without it a duplicate name is an error naming both plugins.

A factory may define ``check(**params) -> list[str]`` (e.g. as a staticmethod): it receives the
same arguments as the factory and returns problems found before anything is allocated (e.g. rope
needs an even head dimension). Recipe validation reports them with the other problems.

A component module may define ``hf_weights(family: str) -> list[TensorMap] | None``: where its
tensors live in a Hugging Face checkpoint of that family ("gpt2": GPT2LMHeadModel, "llama":
LlamaForCausalLM), relative to its place there (gptzoo.interfaces.TensorMap). The maps must cover
its state dict exactly (a contract test checks it); None, or no such method, means the family has
no equivalent of the component, and import and export refuse it with that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pluggy

PROJECT = "gptzoo"
KINDS = ("norm", "activation", "mlp", "position", "attention", "sampler")
"""The component kinds, in the order a model is described."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Register(Protocol):
    def __call__(
        self, name: str, factory: Callable[..., Any], *, doc: str | None = None, override: bool = False
    ) -> None: ...


@hookspec
def register_norms(register: Register) -> None:
    """Register normalization layers.

    Factory: ``factory(dim: int, *, eps: float = ..., **params) -> nn.Module``.
    Forward: x (B, T, dim) -> (B, T, dim), same dtype. Whether a norm sits before (pre) or after
    (post) the residual addition is the recipe's ``norm_placement``, not the norm's business.
    A norm's bias is its own parameter (``norm = { name = "layernorm", bias = false }``): the
    recipe's ``bias`` covers the linear layers only, since checkpoints differ on the two.
    """


@hookspec
def register_activations(register: Register) -> None:
    """Register elementwise activations.

    Factory: ``factory(**params) -> nn.Module``. Forward: any shape -> same shape and dtype.
    """


@hookspec
def register_mlps(register: Register) -> None:
    """Register the feed-forward part of a block.

    Factory: ``factory(d_model: int, d_ff: int, *, activation: nn.Module, bias: bool, **params)
    -> nn.Module``. Forward: x (B, T, d_model) -> (B, T, d_model).
    The module must expose ``c_proj``, the nn.Linear that writes into the residual stream (the
    model scales its initialization by 1/sqrt(2 n_layer), as GPT-2 does), and
    ``flops(n_tokens: int) -> dict[str, int]``: the matmul FLOPs of a forward over that many
    tokens, one multiply-add counted as 2 FLOPs, by part name.
    """


@hookspec
def register_positions(register: Register) -> None:
    """Register position encodings.

    Factory: ``factory(*, n_embd: int, n_head: int, head_dim: int, context_length: int, **params)
    -> gptzoo.interfaces.Position``. A Position has three optional capabilities, each a no-op by
    default: ``embed(positions)`` adds (T, n_embd) to the token embeddings (learned, sinusoidal);
    ``rotary(positions)`` returns a Rotary that rotates q and k (rope); ``attn_bias(q_pos, k_pos)``
    returns an additive (n_head, Tq, Tk) bias (alibi). Positions are absolute, so the encoding
    works with a KV cache. ``max_positions`` declares the longest sequence it can encode
    (None: no limit); the model refuses longer inputs with a clear error.
    The model computes these once per forward pass and hands them to every attention layer
    through an AttentionContext, so one position module serves all layers.
    """


@hookspec
def register_attentions(register: Register) -> None:
    """Register causal self-attention layers.

    Factory: ``factory(d_model: int, n_head: int, *, n_kv_head: int, head_dim: int, bias: bool,
    **params) -> nn.Module``; n_head % n_kv_head == 0 (MHA: equal, GQA: fewer, MQA: one).
    Forward: ``forward(x (B, T, d_model), ctx: AttentionContext, cache: LayerKVCache | None)
    -> (B, T, d_model)``. The context carries the rotary embedding, the additive mask and the cache
    offset; the layer must never let a query see a later key.
    The module must expose ``c_proj`` (the output projection, as for mlps), ``init_cache(
    batch_size, max_len, *, device, dtype) -> LayerKVCache`` and ``flops(batch, seq_len) ->
    dict[str, int]`` (matmul FLOPs of a cache-less forward, by part name).
    """


@hookspec
def register_samplers(register: Register) -> None:
    """Register steps of the sampler chain.

    Factory: ``factory(**params) -> gptzoo.interfaces.Sampler``. A step maps next-token logits
    (B, V) float and the tokens so far (B, T) to logits (B, V) (use -inf to forbid a token). A step
    that chooses the token itself sets ``picks = True`` and implements ``pick(logits, generator)
    -> (B,)``; it must be the last step. A chain whose last step does not pick samples from the
    softmax of the transformed logits with the given torch.Generator.
    Factories raise ValueError for out-of-range parameters (e.g. top_p outside (0, 1]).
    """

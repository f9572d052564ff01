"""Hook specifications and the contract table: one hook and one :class:`Contract` per component kind.

A plugin implements any of these hooks and calls ``register`` once per component::

    import gptzoo

    @gptzoo.hookimpl
    def register_norms(register):
        register("rmsnorm", RMSNorm)

``register(name, factory, *, doc=None, override=False)``:
    name: the registry key recipes use; names match exactly. ``DIST:name`` (the distribution's
        name, e.g. ``gptzoo-extras:ring_window``) always reaches it (gptzoo.registry).
    factory: a callable; its signature is the kind's contract below. Every keyword parameter
        beyond the structural ones must have a default (a plugin whose factory lacks one fails at
        registration): recipe parameters are passed by name and validated against this signature,
        and contract tests build each component with defaults. Or a reference to the callable,
        ``"module:attribute"`` as an entry point writes it (``"gptzoo_plugins._norms:RMSNorm"``):
        the module is imported the first time the factory is needed (a build, a recipe's parameters,
        the conformance kit), never to list components, and a reference that cannot be imported, or
        names a factory registration would refuse, is then a PluginError naming it (gptzoo.registry).
    doc: one line for listings; defaults to the first line of the factory's docstring (required
        with a reference, which listings do not import).
    override: take the bare name from an entry of the same name registered by an earlier plugin
        (built-ins come first); the replaced entry stays reachable qualified. Without it a name a
        built-in has stays the built-in's, and a name two plugins register is ambiguous: usable
        only qualified. One plugin registering a name twice fails.

:data:`CONTRACTS` is the single home of what each kind's factory receives from the model
(``structural``), which of its arguments are other components the builder makes (``components``),
the members a built object must expose (``members``) and the optional methods it may have
(``optional``). Recipe validation, the builder, the contract tests and ``gptzoo list`` read it; a
test checks that every hook's docstring below says the same. The typed shape of each kind's built
object is the Protocol (or base class) named by ``interface`` in gptzoo.interfaces: a member it
annotates with a class (or a union of classes) must be an instance of one, a member it defines as
a method must be callable (gptzoo.plugin_code.check_contract). Every parameter and persistent buffer
of a built module is float32, bfloat16 or float16 (or torch's default dtype), as a checkpoint's
weights are. A buffer registered with ``persistent=False`` is refused: a checkpoint is loaded into a
model built on the meta device, where nothing outside the state dict gets a value; a table derived
from the constructor's arguments (rotary frequencies, integer counters) is computed in forward.

On the factory, for every kind (optional):

- ``check(**params) -> list[str]`` (e.g. a staticmethod): it receives the same
  arguments as the factory and returns problems found before anything is allocated (e.g. rope
  needs an even head dimension). Recipe validation reports them with the other problems; a check
  that raises, or returns anything but a list (or tuple) of str, is a PluginError naming its plugin
  (gptzoo.plugin_code, which runs factories the same way). Before ``check`` runs, validation refuses
  any float parameter that is not finite (nan, +-inf) and any integer outside int64, and passes a
  parameter whose default is a float as a Python float; a component that needs "no limit" takes a
  finite sentinel (e.g. 0), not inf.
- ``examples: list[dict]``: parameter sets the conformance kit (gptzoo.testing) builds and runs
  besides the defaults, e.g. ``[{"window": 3}]`` so that a small window really is exercised.

On the built module, for every kind but samplers (optional):

- ``reset_parameters()``: the component initializes its own parameters, and the model leaves the
  whole component alone. GPT-2's initialization (normal(0, init_std) for linear weights, zero
  biases, and std / sqrt(2 n_layer) for the ``c_proj`` of attentions and mlps) is for components
  without one.
- ``active_parameters() -> int`` (contract 3): how many of its parameters one token uses (a mixture
  of experts: the router, the shared experts and k of its E experts); without it, all of them.
  ``gptzoo build`` shows the model's total and active parameters, and a sweep can match variants by
  active parameters (``match = "active_params"``).
- ``aux_losses() -> dict[str, Tensor]`` (contract 3): the auxiliary losses of its latest forward, by
  name, each a scalar tensor in the graph (a router's load-balancing loss, a z-loss). The model's
  auxiliary loss of a name is the mean over the components that report it (``GPT.aux_losses``);
  training adds their sum times ``[train] aux_loss_weight`` to the loss and logs each as
  ``aux_NAME`` in metrics.jsonl. A component reports what its forward computed and nothing else.
- ``stats() -> dict[str, Tensor]`` (contract 5): statistics of its latest forward for a person to watch
  while it trains, by name (an identifier, not a key the trainer's records have: :data:`RECORD_KEYS`),
  each a float tensor, either a scalar or a 1-D share of a whole: non-negative, summing to 1 (a router's
  fraction of the tokens' choices per expert). Training reads it after each micro-batch's forward and
  logs, per component (keyed by its path in the model, ``blocks.3.mlp``), the mean over the logging
  window: ``NAME`` for a scalar; for a share ``NAME_max_mean`` (its largest entry over its mean, 1.0
  when perfectly even) and, when it has at most :data:`STAT_VECTOR_LIMIT` entries, ``NAME`` itself.
  A ``stats`` that takes arguments is not this member and is left alone.
- ``flops(batch, seq_len) -> dict[str, int]`` (contract 3 for norms, activations and positions; mlps
  and attentions must have it): as below. The model's FLOPs are the sum over every module of it that
  declares ``flops``, each counting only its own matmuls (not those of components nested in it), and
  the LM head.
- ``state_bytes(batch_size, dtype) -> int`` (contract 8; attentions): the bytes of its cache
  (``kv_bytes``) that do not grow with the length: a recurrent or convolutional mixer's state, the
  whole of what its cache holds; without it, none (every byte of the cache is counted per token).
  ``gptzoo build`` shows them per sequence, apart from the KV cache per token.
- ``decode_cost(cache_len, dtype) -> {"flops": int, "bytes": int}`` (contract 3): the matmul FLOPs
  and the bytes read (weights and cache, in dtype) of decoding one new token of one sequence after
  cache_len cached ones (a latent attention reads its c + r latent per cached token, not every head's
  keys and values). ``gptzoo build`` sums it over the model at the context length; without it,
  gptzoo.decode_cost derives one from ``flops(1, 1)``, the active parameters and ``kv_bytes``.

On the built module's class, for every kind but samplers (optional):

- ``int8: bool | tuple[str, ...]`` (contracts 4 to 6): which of the nn.Linear modules inside it
  ``--dtype int8`` and ``int4`` may quantize. Since contract 7 a plugin registers that with
  gptzoo.inference.hooks.register_quantized_linears; the attribute is still read, with one warning.

What a subsystem knows of a component class is not a method of it: a plugin registers it through
the subsystem's own hooks (gptzoo.plugin_manager.SUBSYSTEMS; gptzoo.class_table), e.g. its share of a
CPU decoding step with gptzoo.inference.hooks.register_decode_lowerings.

Contract versions. :data:`CONTRACT_VERSION` is the version of what this module describes; it grows
by one with each change a plugin written for the version before could notice (gptzoo.compat lists
them, docs/plugins.md keeps their changelog). A plugin module says which version it was written
for with a module attribute, ``gptzoo_contract = 4`` (:data:`CONTRACT_ATTRIBUTE`); one that declares
a newer version than this gptzoo's is refused at load. A component written against an older form of
a member is adapted (with one gptzoo.errors.GptzooWarning) or refused with a PluginError, as its row
in gptzoo.compat.CHANGES says.

Members that every kind with them shares:

- ``flops(batch: int, seq_len: int) -> dict[str, int]`` (mlps and attentions): the matmul FLOPs
  that a cache-less forward over (batch, seq_len) tokens executes, by part name, one multiply-add
  counted as 2 FLOPs (what torch.utils.flop_counter.FlopCounterMode counts; attention scores are
  counted over the full T x T square, as scaled_dot_product_attention computes them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pluggy

from gptzoo.moves import moved

PROJECT = "gptzoo"
CONTRACT_VERSION = 8
"""The version of the plugin contract this gptzoo implements (see the module docstring)."""
CONTRACT_ATTRIBUTE = "gptzoo_contract"
"""The plugin module's attribute that declares the contract version it was written for (optional)."""

RECORD_KEYS = frozenset(
    ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "skipped", "time", "val_loss", "val_ppl")
)
"""The keys of a training record (metrics.jsonl) that a component's ``stats`` must not take (nor ``aux_*``)."""
STAT_MAX_MEAN = "_max_mean"
"""The suffix of a share's balance in a training record: ``expert_load_max_mean``."""
STAT_VECTOR_LIMIT = 16
"""A share reported by ``stats`` is logged whole when it has at most this many entries (else only its max/mean)."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class Contract:
    """What one component kind's factory receives and what its product exposes."""

    kind: str
    interface: str
    """The Protocol or base class in gptzoo.interfaces that a built component satisfies."""
    recipe_key: str | None
    """The [model] key that names this kind's component; None when the recipe places it elsewhere
    (samplers are a chain in [generate])."""
    structural: tuple[tuple[str, str], ...] = ()
    """(factory argument, [model] attribute) pairs the model passes besides the recipe's parameters."""
    components: tuple[str, ...] = ()
    """Factory arguments that are themselves components (of the kind of the same name), built first."""
    builders: tuple[str, ...] = ()
    """Factory arguments that build a component of the kind of the same name at a width the factory
    chooses, ``builder(dim) -> module`` (an attention's q/k norms: the layer's norm at head_dim), or with
    parameters of that component to set otherwise, ``builder(dim, eps=1e-6)`` (the latent attention's
    ``latent_eps``); passed only to a factory whose signature names them."""
    members: tuple[str, ...] = ()
    """Attributes and methods the built object must have."""
    optional: tuple[str, ...] = ("reset_parameters", "active_parameters", "aux_losses", "stats", "flops", "decode_cost")
    """Methods the built object may have (see the module docstring)."""
    factory_optional: tuple[str, ...] = ("check", "examples")
    """Attributes the factory may have (see the module docstring)."""
    positive: tuple[str, ...] = ()
    """Members that count something: when the member holds an int, it is at least 1."""
    module: bool = True
    """Whether the built object must be a torch nn.Module (a model's component); if not, it must be callable."""

    @property
    def hook(self) -> str:
        return f"register_{self.kind}s"

    @property
    def given_by_model(self) -> frozenset[str]:
        """Factory arguments that never come from the recipe."""
        return frozenset(arg for arg, _ in self.structural) | frozenset(self.components) | frozenset(self.builders)


CONTRACTS: dict[str, Contract] = {
    c.kind: c
    for c in (
        Contract("norm", "Norm", "norm", structural=(("dim", "n_embd"),)),
        Contract("activation", "Activation", "activation"),
        Contract(
            "mlp",
            "MLP",
            "mlp",
            structural=(("d_model", "n_embd"), ("d_ff", "d_ff"), ("bias", "bias")),
            components=("activation",),
            members=("flops",),
            optional=("c_proj", "reset_parameters", "active_parameters", "aux_losses", "stats", "decode_cost"),
        ),
        Contract(
            "position",
            "Position",
            "position",
            structural=(
                ("n_embd", "n_embd"),
                ("n_head", "n_head"),
                ("head_dim", "head_dim"),
                ("context_length", "context_length"),
            ),
            members=("max_positions", "embed", "rotary", "attn_bias"),
            positive=("max_positions",),
        ),
        Contract(
            "attention",
            "Attention",
            "attention",
            structural=(
                ("d_model", "n_embd"),
                ("n_head", "n_head"),
                ("n_kv_head", "n_kv_head"),
                ("head_dim", "head_dim"),
                ("bias", "bias"),
            ),
            builders=("norm",),
            members=("c_proj", "init_cache", "kv_bytes", "flops"),
            optional=("reset_parameters", "active_parameters", "aux_losses", "stats", "decode_cost", "state_bytes"),
        ),
        Contract(
            "sampler",
            "Sampler",
            None,
            members=("picks", "pick"),
            optional=("reset",),
            factory_optional=("check", "examples", "flag", "sampling_only", "greedy"),
            module=False,
        ),
    )
}
"""kind -> its contract, in the order a model is described."""

KINDS = tuple(CONTRACTS)
"""The component kinds."""

OTHER_HOOKS = ("register_recipes",)
"""The hooks of this module beside the one per kind: the recipes and sweep specs a plugin ships. What a
subsystem knows of a component class (a decode lowering, a Hugging Face layout, adapter parts, a cache
mover) is registered through that subsystem's own hooks (gptzoo.plugin_manager.SUBSYSTEMS)."""


class Register(Protocol):
    def __call__(
        self, name: str, factory: Callable[..., Any], *, doc: str | None = None, override: bool = False
    ) -> None: ...


@hookspec
def register_norms(register: Register) -> None:
    """Register normalization layers.

    Factory: ``factory(dim, *, **params) -> Norm``. Forward: x (B, T, dim) -> (B, T, dim), same
    dtype. Whether a norm sits before (pre) or after (post) the residual addition is the recipe's
    ``norm_placement``, not the norm's business. A norm's bias is its own parameter
    (``norm = { name = "layernorm", bias = false }``): the recipe's ``bias`` covers the linear
    layers only, since checkpoints differ on the two.

    Members: none.
    Optional: ``reset_parameters``, ``active_parameters``, ``aux_losses``, ``stats``, ``flops``, ``decode_cost``.
    On the factory: ``check``, ``examples``.
    """


@hookspec
def register_activations(register: Register) -> None:
    """Register elementwise activations.

    Factory: ``factory(*, **params) -> Activation``. Forward: any shape -> same shape and dtype.

    Members: none.
    Optional: ``reset_parameters``, ``active_parameters``, ``aux_losses``, ``stats``, ``flops``, ``decode_cost``.
    On the factory: ``check``, ``examples``.
    """


@hookspec
def register_mlps(register: Register) -> None:
    """Register the feed-forward part of a block.

    Factory: ``factory(d_model, d_ff, *, activation, bias, **params) -> MLP``; ``activation`` is a
    built activation module. Forward: x (B, T, d_model) -> (B, T, d_model).
    ``c_proj`` is the nn.Linear that writes into the residual stream (the model scales its
    initialization by 1/sqrt(2 n_layer), as GPT-2 does); an mlp with several such projections (a
    mixture of experts) has none of its own, and each module inside it with an nn.Linear ``c_proj``
    (each expert) gets that scaling. ``flops(batch, seq_len)`` as in the module docstring.

    Members: ``flops``.
    Optional: ``c_proj``, ``reset_parameters``, ``active_parameters``, ``aux_losses``, ``stats``, ``decode_cost``.
    On the factory: ``check``, ``examples``.
    """


@hookspec
def register_positions(register: Register) -> None:
    """Register position encodings.

    Factory: ``factory(*, n_embd, n_head, head_dim, context_length, **params) -> Position``
    (subclass gptzoo.interfaces.Position). A Position has three capabilities, each a no-op by
    default: ``embed(positions)`` adds (T, n_embd) to the token embeddings (learned, sinusoidal);
    ``rotary(positions)`` returns a Rotary that rotates q and k (rope); ``attn_bias(q_pos, k_pos)``
    returns an additive (n_head, Tq, Tk) bias (alibi). Positions are absolute, so the encoding
    works with a KV cache. ``max_positions`` declares the longest sequence it can encode,
    an int of at least 1 (None: no limit); the fewest among a model's encodings is its limit
    (GPT.max_positions), past which generate, eval and build refuse a sequence, naming the encoding.
    The model computes these once per forward pass and hands them to every attention layer
    through an AttentionContext, so one position module serves all layers.

    Members: ``max_positions``, ``embed``, ``rotary``, ``attn_bias``.
    Optional: ``reset_parameters``, ``active_parameters``, ``aux_losses``, ``stats``, ``flops``, ``decode_cost``.
    On the factory: ``check``, ``examples``.
    """


@hookspec
def register_attentions(register: Register) -> None:
    """Register causal self-attention layers.

    Factory: ``factory(d_model, n_head, *, n_kv_head, head_dim, bias, **params) -> Attention``;
    n_head % n_kv_head == 0 (MHA: equal, GQA: fewer, MQA: one). A factory that also names ``norm``
    receives ``norm(dim) -> Norm``, which builds the layer's norm (the recipe's, with its parameters)
    at width dim, e.g. to normalize each head's queries and keys (QK-norm); the norms it builds are
    components like any other (contract-checked, initialized, exported).
    Forward: ``forward(x (B, T, d_model), ctx: AttentionContext, cache: LayerKVCache | None)
    -> (B, T, d_model)``. The context carries the rotary embedding, the additive mask over every key so
    far, the cache offset, the positions of queries and keys and the position bias (a layer that keeps
    only some keys builds its own mask from those); the layer must never let a query see a later key.
    ``c_proj`` is the output projection (as for mlps); ``init_cache(batch_size, max_len, *, device,
    dtype) -> LayerKVCache`` allocates the layer's cache for sequences of up to max_len tokens (its
    own shape: a sliding window may keep only its last ``window`` positions) and
    ``kv_bytes(batch_size, max_len, dtype) -> int`` says exactly how many bytes that cache holds,
    without allocating it (memory checks and ``gptzoo build`` read it); ``flops(batch, seq_len)``
    as in the module docstring. A token mixer that keeps no keys (a recurrence, a short convolution)
    takes an attention's place: its cache holds a constant-size state, which ``state_bytes(batch_size,
    dtype)`` says (contract 8).

    Members: ``c_proj``, ``init_cache``, ``kv_bytes``, ``flops``.
    Optional: ``reset_parameters``, ``active_parameters``, ``aux_losses``, ``stats``, ``decode_cost``,
    ``state_bytes``.
    On the factory: ``check``, ``examples``.
    """


@hookspec
def register_samplers(register: Register) -> None:
    """Register steps of the sampler chain.

    Factory: ``factory(*, **params) -> Sampler`` (subclass gptzoo.interfaces.Sampler). A step maps
    next-token logits (B, V) float and the tokens so far (B, T) to logits (B, V) (use -inf to
    forbid a token). A step that chooses the token itself sets ``picks = True`` and implements
    ``pick(logits, generator) -> (B,)``; it must be the last step. A chain whose last step does not
    pick samples from the softmax of the transformed logits with the given torch.Generator.
    Factories raise ValueError for out-of-range parameters (e.g. top_p outside (0, 1]).
    ``flag`` (a gptzoo.interfaces.SamplerFlag) gives the step a command-line flag of ``gptzoo
    generate`` (``--top-k`` for ``top_k``) and its place in Hugging Face's order (its
    ``zero_is_greedy``: the value 0 asks for greedy decoding, as ``--temperature 0``); ``sampling_only``
    (True for temperature, top_k, ...) drops the step when such a flag asks for greedy; ``greedy``
    (True for the built-in greedy step) marks the picking step a chain ends in when nothing samples.
    Any step, flagged or not, is reachable as ``--sampler NAME:param=value``. Contract 4: a step's
    ``__call__`` that names ``real`` gets (B, T) bool, False at a batch's left padding (which repeats
    the row's first token), so that a step counting the history counts real tokens only; one that
    names ``generator`` gets the generation's torch.Generator, to draw from (a stochastic step before
    the final pick); ``reset()`` is called before each generation, for per-generation state.

    Members: ``picks``, ``pick``.
    Optional: ``reset``.
    On the factory: ``check``, ``examples``, ``flag``, ``sampling_only``, ``greedy``.
    """


class RegisterRecipe(Protocol):
    def __call__(self, name: str, path: str | os.PathLike[str], *, sweep: bool = False) -> None: ...


@hookspec
def register_recipes(register: RegisterRecipe) -> None:
    """Register the model recipes and sweep specs a plugin ships, by name (contract 3).

    ``register(name, path, *, sweep=False)``: ``path`` is the TOML file (shipped as package data beside
    the plugin module: ``Path(__file__).parent / "recipes" / "tiny-moe.toml"``), a sweep spec when
    ``sweep``. ``gptzoo build NAME``, ``train``, ``generate`` and ``gptzoo sweep NAME`` find it, and
    ``gptzoo recipes`` lists it with its distribution. A name a shipped recipe has stays the shipped one's,
    with one warning naming the plugin's and its qualified name ``DIST:NAME``, which always reaches it; a
    bare name two plugins register is reachable only qualified. A path that is not a file fails the plugin
    at load, with the reason.
    """


def __getattr__(name: str) -> Any:
    """A name that moved to its subsystem (gptzoo.moves.MOVES), with one GptzooWarning per import."""
    return moved(__name__, name)

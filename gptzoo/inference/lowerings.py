"""Lowerings: what each component computes in a CPU decoding step, as native operations.

A lowering is a function ``lower(plan, module, src, dst, **kwargs)`` that appends the operations
of one module to a step's plan (gptzoo.inference.plan.DecodePlan, implemented by
gptzoo.inference.decode_plan.NativePlan; native/step.c runs them), the module's children through
``plan.call``. It is keyed by the class it lowers, ``"module:Qualname"`` (a gptzoo.class_table): the
built-in ones in :data:`BUILTIN_LOWERINGS`, by reference, so that the decoder imports no component's
module; a plugin registers one for its own component with the ``register_decode_lowerings`` hook
(gptzoo.inference.hooks), collected by the registry. Norms, mlps and linear layers take ``src`` and
``dst`` Buffers; activations also ``gated``; attentions (and blocks) also ``position`` (the step's
PositionStep) and ``cache`` (the layer's); the model's lowering takes the KV cache and returns the
buffer of the logits.

A module is lowered by the lowering of the first class of its MRO that has one, unless a class
below that one overrides ``forward`` or a method the lowering depends on (``depends``, e.g. an
attention's ``attend``), or the module has forward hooks or a forward of its own: then the plan
refuses it, with the reason, and the module runs its eager forward within the step (a split plan,
gptzoo.inference.decode_plan) or the model decodes with its eager forward (a strict one). A block (PreNormBlock and
its shapes) is lowered from its own forward, traced once per class (torch.fx) into calls of its
parts and sums, so its dataflow is written once; so is a compound component (the mlps, an expert:
:func:`lower_traced`), whose forward splits, gates and clamps its parts' results as well, so that only
leaf operations (linear layers, norms, activations, attentions, routing) keep lowerings written by hand.
A plugin's compound gets the same by registering ``"gptzoo.inference.lowerings:lower_traced"`` for its
class. A component of the previous contract, a
``decode_ops(plan, src, dst, ...)`` method on the class, is still lowered by that method, with one
GptzooWarning per class saying how to register its lowering instead.
"""

from __future__ import annotations

import inspect
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

from gptzoo.class_table import ClassTable, Row
from gptzoo.errors import GptzooWarning, describe_exception
from gptzoo.inference.hooks import LOWERINGS, ROTARY_TABLES
from gptzoo.inference.matvec import runs_its_class_forward
from gptzoo.inference.plan import Buffer, DecodePlan, PositionStep
from gptzoo.interfaces import LayerKVCache
from gptzoo.model.kv_cache import KVCache
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Provenance, Registry, class_key

Lower = Callable[..., Any]
"""``lower(plan, module, *args, **kwargs)``: a module's operations appended to ``plan``."""


class Unsupported(Exception):
    """The model cannot be described as native operations; the message says what and why."""


# --- the built-in lowerings ----------------------------------------------------------------------


def lower_linear(plan: DecodePlan, linear: nn.Linear, src: Buffer, dst: Buffer) -> None:
    plan.linear(linear.weight, None, linear.bias, src, dst)


def lower_lora_linear(plan: DecodePlan, linear: Any, src: Buffer, dst: Buffer) -> None:
    """A projection with low-rank adapters (gptzoo.adapters.lora) decodes as one linear layer of its merged
    weight, made when the plan is: measured faster than the adapters as a side path of two more products
    (bench/adapters.py), the same tokens; the eager forward keeps the side path, which peft computes."""
    plan.linear(linear.merged_weight().contiguous(), None, linear.bias, src, dst)


def lower_identity(plan: DecodePlan, identity: nn.Identity, src: Buffer, dst: Buffer) -> None:
    plan.copy(src, dst)


def lower_quantized_linear(plan: DecodePlan, linear: Any, src: Buffer, dst: Buffer) -> None:
    plan.linear(linear.qweight, linear.scale, linear.bias, src, dst)


def lower_layernorm(plan: DecodePlan, norm: Any, src: Buffer, dst: Buffer) -> None:
    plan.layernorm(src, dst, norm.weight, norm.bias, norm.eps)


def lower_rmsnorm(plan: DecodePlan, norm: Any, src: Buffer, dst: Buffer) -> None:
    plan.rmsnorm(src, dst, norm.weight, norm.eps, "scale_in_float32" if norm.scale_in_float32 else "plain")


def lower_gemma_rmsnorm(plan: DecodePlan, norm: Any, src: Buffer, dst: Buffer) -> None:
    plan.rmsnorm(src, dst, norm.weight, norm.eps, "offset")


def activation(name: str) -> Lower:
    """The lowering of an activation step.c computes (gptzoo.inference.native.abi.ACTIVATIONS)."""

    def lower(plan: DecodePlan, act: nn.Module, src: Buffer, dst: Buffer, *, gated: bool) -> None:
        plan.activate(src, dst, name, gated=gated)

    lower.__name__ = lower.__qualname__ = f"lower_{name}"
    return lower


ROUTER = "gptzoo_plugins._moe:Router"


def lower_moe(plan: DecodePlan, moe: Any, src: Buffer, dst: Buffer) -> None:
    """A mixture of experts: the router's logits, its choice (plan.route), the chosen experts only
    (plan.mixture), the shared expert (scaled by its gate) added."""
    router = moe.router
    if class_key(type(router)) != ROUTER or not runs_its_class_forward(router):
        plan.refuse(
            f"{type(moe).__name__}'s router is a {type(router).__name__}, not the Router its lowering describes"
        )
    logits = plan.buffer(router.out_features)
    plan.linear(router.weight, None, router.bias, src, logits)
    route = plan.route(
        logits,
        top_k=router.top_k,
        scoring=router.scoring,
        normalize=router.normalize,
        routed_scale=router.routed_scale,
        groups=router.groups,
        group_top_k=router.group_top_k,
        group_score=router.group_score,
        score_bias=router.score_bias,
    )
    if moe.shared is None:
        plan.mixture(route, moe.experts, src, dst)
        return
    routed, shared = plan.buffer(dst.width), plan.buffer(dst.width)
    plan.mixture(route, moe.experts, src, routed)
    plan.call(moe.shared, src, shared)
    if moe.shared_gate is not None:
        gate = plan.buffer(1)
        plan.call(moe.shared_gate, src, gate)
        plan.sigmoid_scale(gate, shared, shared)
    plan.add(routed, shared, dst)


def _attention(
    plan: DecodePlan, attn: Any, src: Buffer, dst: Buffer, position: PositionStep, cache: LayerKVCache, *, fused: bool
) -> None:
    if type(cache) is not LayerKVCache and class_key(type(cache)) != WINDOW_CACHE:
        plan.refuse(f"{type(attn).__name__} decodes with a cache of its own class {type(cache).__name__}")
    nh, nkv, hs = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = plan.buffer((nh + 2 * nkv) * hs)
    gate = None
    if getattr(attn, "output_gate", False):  # c_attn: each head's query then its gate, then k and v
        raw, gate = plan.buffer((2 * nh + 2 * nkv) * hs), plan.buffer(nh * hs)
        plan.call(attn.c_attn, src, raw)
        for part, offset in ((qkv, 0), (gate, hs)):
            plan.slice_heads(
                raw.cols(offset, 2 * nh * hs - offset), part, nh, hs, src_step=2 * hs, dst_step=hs, deinterleave=False
            )
        width = 2 * nkv * hs
        plan.slice_heads(
            raw.cols(2 * nh * hs, width),
            qkv.cols(nh * hs, width),
            1,
            width,
            src_step=width,
            dst_step=width,
            deinterleave=False,
        )
    else:
        plan.call(attn.c_attn, src, qkv)
    q, k = qkv.cols(0, nh * hs), qkv.cols(nh * hs, nkv * hs)
    if attn.qk_norm != "none":  # over each head (its weight has hs features) or the whole projection
        plan.call(attn.q_norm, q, q)
        plan.call(attn.k_norm, k, k)
    plan.rope(q, hs, position)
    plan.rope(k, hs, position)
    y = plan.buffer(nh * hs)
    sizes = (nh, nkv, hs)
    sinks = getattr(attn, "sinks", None)
    plan.attend(
        qkv,
        sizes,
        cache.k,
        cache.v,
        y,
        window=attn.window,
        scale=attn.scale,
        softcap=attn.softcap,
        fused=fused and sinks is None,
        sinks=sinks,
    )
    if gate is not None:  # Qwen3-Next / Qwen3.5's gated output
        plan.sigmoid_scale(gate, y, y)
    plan.call(attn.c_proj, y, dst)


def lower_causal_attention(
    plan: DecodePlan, attn: Any, src: Buffer, dst: Buffer, *, position: PositionStep, cache: LayerKVCache
) -> None:
    """As its forward computes one query: explicitly with a softcap or sinks, and in float32 without a
    mask (left padding), by scaled_dot_product_attention otherwise (CausalSelfAttention.attend)."""
    fused = not attn.softcap and (plan.dtype != torch.float32 or plan.key_mask is not None)
    _attention(plan, attn, src, dst, position, cache, fused=fused)


def lower_eager_attention(
    plan: DecodePlan, attn: Any, src: Buffer, dst: Buffer, *, position: PositionStep, cache: LayerKVCache
) -> None:
    _attention(plan, attn, src, dst, position, cache, fused=False)


LATENT_CACHE = "gptzoo_plugins._mla:LatentKVCache"
"""The cache of the built-in latent attention: its latents and rotary keys, which latent_attend reads."""


def lower_latent_attention(
    plan: DecodePlan, attn: Any, src: Buffer, dst: Buffer, *, position: PositionStep, cache: Any
) -> None:
    """A decoding step of multi-head latent attention in its absorbed form, as LatentAttention.absorbed
    computes it: the queries (q, or q_a, q_norm, q_b), the latent and rotary key (kv_a, kv_norm on the
    latent), each head's rotary features (de-interleaved where stored interleaved) rotated with the rotary
    key, kv_b's key half folded into each head's query, latent_attend over the cached latents, kv_b's value
    half, c_proj. The key half is applied transposed (q_latent[h] = W_k[h]^T q_nope[h]) as a threaded gemv
    per head of a transposed contiguous copy, (nh, c, nope_dim), which the plan keeps: nh x c x nope_dim
    more weights per layer (half of kv_b; 16.8 MB a layer for DeepSeek-V3 in bfloat16), made once per
    generation. Measured against an axpy over kv_b's own rows on the calling thread (DeepSeek-V2-Lite's
    attention widths, 4 layers, float32, 64 cached tokens): 11.1 against 12.0 ms a step on 2 threads,
    19.3 against 19.5 on one."""
    if class_key(type(cache)) != LATENT_CACHE:
        plan.refuse(f"{type(attn).__name__} decodes with a cache of class {type(cache).__name__}, not LatentKVCache")
    nh, n, r, v, c = attn.n_head, attn.nope_dim, attn.rope_dim, attn.v_dim, attn.kv_rank
    q = plan.buffer(nh * (n + r))  # per head: nope_dim, then rope_dim features
    if attn.q_rank:
        a = plan.buffer(attn.q_rank)
        plan.call(attn.q_a, src, a)
        plan.call(attn.q_norm, a, a)
        plan.call(attn.q_b, a, q)
    else:
        plan.call(attn.q, src, q)
    kv = plan.buffer(c + r)  # the latent, then the rotary key
    plan.call(attn.kv_a, src, kv)
    latent, k_rope = kv.cols(0, c), kv.cols(c, r)
    plan.call(attn.kv_norm, latent, latent)
    absorbed = plan.buffer(nh * (r + c))  # per head: the rotated rotary query, then the latent query
    interleaved = bool(attn.rope_interleave)
    plan.slice_heads(
        q.cols(n, nh * (n + r) - n), absorbed, nh, r, src_step=n + r, dst_step=r + c, deinterleave=interleaved
    )
    if interleaved:
        plan.slice_heads(k_rope, k_rope, 1, r, src_step=r, dst_step=r, deinterleave=True)
    plan.rope(absorbed, r + c, position)
    plan.rope(k_rope, r, position)
    w = attn.kv_b.weight.detach().view(nh, n + v, c)
    keys = w[:, :n].transpose(1, 2).contiguous()  # (nh, c, n): W_k[h]^T, rows contiguous
    plan.heads_linear(keys, q, absorbed.cols(r, nh * (r + c) - r), src_step=n + r, dst_step=r + c)
    out = plan.buffer(nh * c)
    plan.latent_attend(absorbed, kv, cache.latent, cache.k_rope, out, heads=nh, scale=attn.scale)
    y = plan.buffer(nh * v)
    plan.heads_linear(w[:, n:], out, y, src_step=c, dst_step=v)
    plan.call(attn.c_proj, y, dst)


class _Parts(torch.fx.Tracer):
    """Traces a block's forward into calls of its parts (each a leaf) and what it does with their results."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


_dataflows: dict[tuple[type, float], torch.fx.Graph] = {}
"""(Block class, residual multiplier) -> its forward as a graph, traced once."""


def dataflow(block: nn.Module) -> torch.fx.Graph:
    """The block's forward as a graph of calls of its parts, sums and products with a number (traced once per
    class and residual multiplier, which the trace writes in as a number, or leaves out when it is 1)."""
    cls = type(block)
    key = (cls, getattr(block, "residual_multiplier", 1.0))
    if key not in _dataflows:
        try:
            _dataflows[key] = _Parts().trace(block)
        except Exception as exc:  # a forward that branches on its input, or calls what a trace cannot
            raise Unsupported(f"{cls.__name__}'s forward cannot be traced: {describe_exception(exc)}") from exc
    return _dataflows[key]


def lower_block(
    plan: DecodePlan, block: nn.Module, x: Buffer, out: Buffer, *, position: PositionStep, cache: LayerKVCache
) -> None:
    """A block as its forward runs (:func:`dataflow`): each part called on the buffer of its input
    (an attention also with the step's position and its layer's cache), each sum an ``add``, each
    product with a number (the residual multiplier) a ``scale``, the last result written to ``out``;
    a buffer is reused once its value is no longer read."""
    graph = dataflow(block)
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    (result,) = next(node for node in graph.nodes if node.op == "output").args
    if len(inputs) != 3:
        plan.refuse(f"{type(block).__name__}'s forward takes {len(inputs)} arguments, not (x, ctx, cache)")
    x_node, ctx_node, cache_node = inputs
    values: dict[torch.fx.Node, Buffer] = {x_node: x}
    last_use = {arg: node for node in graph.nodes for arg in node.all_input_nodes}
    free: list[Buffer] = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        args = node.args
        if any(arg not in values for arg in args[:1]) or node.kwargs:
            plan.refuse(f"{type(block).__name__}'s forward computes {node.format_node()}, which its lowering cannot")
        dst = out if node is result else (free.pop() if free else plan.buffer(x.width))
        if node.op == "call_module" and args[1:] in ((), (ctx_node, cache_node)):
            extra = {"position": position, "cache": cache} if args[1:] else {}
            plan.call(block.get_submodule(node.target), values[args[0]], dst, **extra)
        elif node.op == "call_function" and node.target is operator.add and len(args) == 2 and args[1] in values:
            plan.add(values[args[0]], values[args[1]], dst)
        elif node.op == "call_function" and node.target is operator.mul and type(args[1]) is float:
            plan.scale(values[args[0]], dst, args[1])  # a sublayer's output times the residual multiplier
        else:
            plan.refuse(
                f"{type(block).__name__}'s forward computes {node.format_node()}; a block's lowering takes calls of "
                "its parts, sums and products with a number"
            )
        values[node] = dst
        for arg in node.all_input_nodes:
            if last_use[arg] is node and arg in values and arg is not x_node:
                free.append(values[arg])
    if result is x_node:
        plan.copy(x, out)


_compounds: dict[tuple[Any, ...], tuple[torch.fx.Graph, dict[str, int]]] = {}
"""A compound component's structure (:func:`_structure`) -> its forward as a graph, and each node's width."""


def _structure(module: nn.Module, width: int) -> tuple[Any, ...]:
    """What a compound's traced graph and widths depend on: its class, its plain attributes (a forward
    branches on them: an expert's ``gated``), its parts' classes and tensor shapes, and its input's width."""
    plain = tuple(sorted((k, v) for k, v in vars(module).items() if type(v) in (bool, int, float, str, type(None))))
    parts = tuple(
        (name, type(child), tuple((n, tuple(t.shape)) for n, t in (*child.named_parameters(), *child.named_buffers())))
        for name, child in module.named_children()
    )
    return type(module), plain, parts, width


class _Widths(torch.fx.Interpreter):
    """Runs a traced forward on one row and records the width of each node's result."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.widths: dict[str, int] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor) and result.dim():
            self.widths[n.name] = result.shape[-1]
        return result


def _compound(module: nn.Module, width: int) -> tuple[torch.fx.Graph, dict[str, int]]:
    """The compound's forward as a graph of calls of its parts, and each node's width, from one row of zeros
    run through it (traced and run once per :func:`_structure`)."""
    key = _structure(module, width)
    if key not in _compounds:
        tensors = [*module.parameters(), *module.buffers()]
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
        device = tensors[0].device if tensors else torch.device("cpu")
        try:
            graph = _Parts().trace(module)
            probe = _Widths(torch.fx.GraphModule(module, graph))
            with torch.no_grad():
                probe.run(torch.zeros(1, width, dtype=dtype, device=device))
        except Exception as exc:  # a forward that branches on its input, or calls what a trace cannot
            raise Unsupported(f"{type(module).__name__}'s forward cannot be traced: {describe_exception(exc)}") from exc
        _compounds[key] = (graph, probe.widths)
    return _compounds[key]


@dataclass(frozen=True)
class _Deferred:
    """A part's call left for its one user, ``part(a) * b``, to make one gated call of."""

    module: nn.Module
    src: Buffer


def _halves(a: Buffer, b: Buffer) -> Buffer | None:
    """The buffer whose first half is ``a`` and second half ``b``, or None when they are not that."""
    if a.tensor is b.tensor and a.width == b.width and a.offset + a.width == b.offset:
        return Buffer(a.tensor, a.offset, 2 * a.width)
    return None


def _split(node: torch.fx.Node) -> tuple[int, int] | None:
    """(chunks, dim) of a ``chunk`` node, or None for another node."""
    if not (node.op == "call_method" and node.target == "chunk") and node.target is not torch.chunk:
        return None
    chunks = node.args[1] if len(node.args) > 1 else node.kwargs.get("chunks")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    return (chunks, dim) if isinstance(chunks, int) and isinstance(dim, int) else None


def _clamp(node: torch.fx.Node) -> tuple[float, float] | None:
    """(low, high) of a ``clamp`` node (infinite where it sets no bound), or None for another node."""
    if not (node.op == "call_method" and node.target == "clamp") and node.target is not torch.clamp:
        return None
    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if not all(v is None or isinstance(v, (int, float)) for v in (low, high)):
        return None
    return float("-inf") if low is None else float(low), float("inf") if high is None else float(high)


def _plain(plan: DecodePlan, part: nn.Module) -> dict[str, bool]:
    """What a plain call of ``part`` passes: ``gated=False`` to a part whose lowering takes ``gated`` (an
    activation's), nothing to the others."""
    lowerings = getattr(plan, "lowerings", None)
    try:
        lower = lowerings.find(part) if isinstance(lowerings, Lowerings) else None
        return {"gated": False} if lower is not None and "gated" in inspect.signature(lower).parameters else {}
    except (Unsupported, TypeError, ValueError):
        return {}


def lower_traced(plan: DecodePlan, module: nn.Module, src: Buffer, dst: Buffer) -> None:
    """A component made of others (an mlp, an expert) as its forward runs, traced (torch.fx) once per
    structure: each part called on the buffer of its input; a ``chunk`` along the last dimension, the
    columns of its parts; ``part(first half) * second half`` of a chunk, one gated call of the part (an
    activation: act(gate) * up); a clamp (plus a number) on the columns it clamps, in place, when nothing
    else reads them; each sum an ``add``; the result written to ``dst``. Anything else is refused, naming it
    (the component then runs its eager forward within the step)."""
    graph, widths = _compound(module, src.width)
    name = type(module).__name__
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    if len(inputs) != 1:
        plan.refuse(f"{name}'s forward takes {len(inputs)} arguments, not (x)")
    (result,) = next(node for node in graph.nodes if node.op == "output").args
    values: dict[torch.fx.Node, Any] = {inputs[0]: src}

    def only_user(node: torch.fx.Node) -> torch.fx.Node | None:
        return next(iter(node.users)) if len(node.users) == 1 else None

    def out(node: torch.fx.Node) -> Buffer:
        return dst if node is result else plan.buffer(widths[node.name])

    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        args, user = node.args, only_user(node)
        given = [values.get(arg) for arg in node.all_input_nodes]
        if any(value is None for value in given):
            plan.refuse(f"{name}'s forward computes {node.format_node()}, which a traced lowering cannot")
        if node.op == "call_module" and len(args) == 1 and not node.kwargs and isinstance(values[args[0]], Buffer):
            part = module.get_submodule(str(node.target))
            if user is not None and user.target is operator.mul and user.args[0] is node:
                values[node] = _Deferred(part, values[args[0]])
                continue
            values[node] = out(node)
            plan.call(part, values[args[0]], values[node], **_plain(plan, part))
        elif (split := _split(node)) is not None and isinstance(values[args[0]], Buffer) and split[1] == -1:
            whole, chunks = values[args[0]], split[0]
            if whole.width % chunks:
                plan.refuse(f"{name}'s forward splits {whole.width} columns into {chunks} chunks")
            width = whole.width // chunks
            values[node] = [whole.cols(i * width, width) for i in range(chunks)]
        elif node.target is operator.getitem and isinstance(values[args[0]], list) and isinstance(args[1], int):
            values[node] = values[args[0]][args[1]]
        elif (bounds := _clamp(node)) is not None and isinstance(values[args[0]], Buffer):
            if only_user(args[0]) is not node:
                plan.refuse(f"{name}'s forward clamps {args[0].name}, which it also reads unclamped")
            shift = user.args[1] if user is not None and user.target is operator.add and user.args[0] is node else 0
            if isinstance(shift, (int, float)) and not isinstance(shift, bool) and shift:
                values[node] = (values[args[0]], bounds)  # done with the shift by its user
            else:
                plan.clamp(values[args[0]], *bounds)
                values[node] = values[args[0]]
        elif node.target is operator.add and isinstance(values[args[0]], tuple) and isinstance(args[1], (int, float)):
            view, (low, high) = values[args[0]]
            plan.clamp(view, low, high, shift=float(args[1]))
            values[node] = view
        elif node.target is operator.add and all(isinstance(values.get(a), Buffer) for a in args):
            values[node] = out(node)
            plan.add(values[args[0]], values[args[1]], values[node])
        elif (
            node.target is operator.mul
            and isinstance(values[args[0]], _Deferred)
            and isinstance(values.get(args[1]), Buffer)
            and (both := _halves(values[args[0]].src, values[args[1]])) is not None
        ):
            values[node] = out(node)
            plan.call(values[args[0]].module, both, values[node], gated=True)
        else:
            plan.refuse(
                f"{name}'s forward computes {node.format_node()}; a traced lowering takes calls of its parts, chunks, "
                "part(first half) * second half, clamps and sums"
            )
    if values[result] is not dst:
        if not isinstance(values[result], Buffer):
            plan.refuse(f"{name}'s forward returns {result.format_node()}, which a traced lowering cannot")
        plan.copy(values[result], dst)


def lower_gpt(plan: DecodePlan, model: Any, cache: KVCache) -> Buffer:
    """A decoding step over ``cache``, as the model's forward computes one token per row; returns the
    buffer the logits (B, V) end in."""
    x = plan.buffer(model.wte.weight.shape[1])
    plan.embed(model.wte.weight, x, model.embed_scale)
    plan.embedding(model.position, x)
    steps = [plan.position(position, x.tensor.device) for position in model.positions]
    for i, block in enumerate(model.blocks):
        plan.call(block, x, x, position=steps[model.position_of[i]], cache=cache.layers[i])
    h = plan.buffer(x.width)
    plan.call(model.ln_f, x, h)
    logits = plan.buffer(model.lm_head.out_features)
    plan.call(model.lm_head, h, logits)
    if model.logits_scaling != 1.0:
        plan.scale(logits, logits, model.logits_scaling, divide=True)
    if model.logit_softcap:
        plan.softcap(logits, model.logit_softcap)
    return logits


WINDOW_CACHE = "gptzoo_plugins._attentions:WindowKVCache"
"""The ring buffer of the built-in sliding-window attention, which step.c's attend reads as the plain cache."""
ATTENTION_DEPENDS = ("attend", "attend_window", "init_cache")
"""What an attention's lowering describes besides forward: a subclass that overrides one computes something else."""
LATENT_DEPENDS = ("queries", "absorbed", "init_cache")
"""What the latent attention's lowering describes besides forward."""


BUILTIN = Provenance("gptzoo.inference", "gptzoo", gptzoo_version())
"""Who gptzoo's own lowerings and rotary tables come from."""


def _rows(table: dict[str, tuple[Lower, tuple[str, ...]]]) -> tuple[Row, ...]:
    return tuple(Row(key, "", lower, BUILTIN, depends) for key, (lower, depends) in table.items())


BUILTIN_LOWERINGS: tuple[Row, ...] = _rows(
    {
        class_key(nn.Linear): (lower_linear, ()),
        class_key(nn.Identity): (lower_identity, ()),
        "gptzoo.adapters.lora:LoRALinear": (lower_lora_linear, ()),
        "gptzoo.inference.quantize:Int8Linear": (lower_quantized_linear, ()),
        "gptzoo.inference.quantize:Int4Linear": (lower_quantized_linear, ()),
        "gptzoo_plugins._norms:LayerNorm": (lower_layernorm, ()),
        "gptzoo_plugins._norms:RMSNorm": (lower_rmsnorm, ()),
        "gptzoo_plugins._norms:GemmaRMSNorm": (lower_gemma_rmsnorm, ()),
        "gptzoo_plugins._activations:GELU": (activation("gelu"), ()),
        "gptzoo_plugins._activations:GELUTanh": (activation("gelu_tanh"), ()),
        "gptzoo_plugins._activations:ReLU": (activation("relu"), ()),
        "gptzoo_plugins._activations:SiLU": (activation("silu"), ()),
        "gptzoo_plugins._activations:QuickGELU": (activation("quick_gelu"), ()),
        "gptzoo_plugins._mlps:DenseMLP": (lower_traced, ()),
        "gptzoo_plugins._mlps:GatedMLP": (lower_traced, ()),
        "gptzoo_plugins._moe:Expert": (lower_traced, ()),
        "gptzoo_plugins._moe:MixtureOfExperts": (lower_moe, ("_chosen_experts",)),
        "gptzoo_plugins._attentions:CausalSelfAttention": (lower_causal_attention, ATTENTION_DEPENDS),
        "gptzoo_plugins._attentions:EagerSelfAttention": (lower_eager_attention, ATTENTION_DEPENDS),
        "gptzoo_plugins._mla:LatentAttention": (lower_latent_attention, LATENT_DEPENDS),
        **{
            f"gptzoo.model.gpt:{block}": (lower_block, ())
            for block in ("PreNormBlock", "PostNormBlock", "SandwichBlock", "ReorderedBlock", "ParallelBlock")
        },
        "gptzoo.model.gpt:GPT": (lower_gpt, ()),
    }
)
"""The lowerings gptzoo ships, one row per class (gptzoo.class_table)."""


RotaryTables = Callable[[Any], tuple[torch.Tensor, torch.Tensor, bool]]
"""``tables(rotary)``: what a position's ``rotary(positions)`` gave for one position, as a step rotates
with it: cos and sin (rotary_dim each, float32) and whether q and k rotate in float32."""


def rotate_half_tables(rotary: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The built-in RotateHalf's tables (its cos and sin are (B, 1, T, rotary_dim) float32)."""
    return rotary.cos.reshape(-1), rotary.sin.reshape(-1), rotary.in_float32


BUILTIN_ROTARY_TABLES: tuple[Row, ...] = _rows({"gptzoo_plugins._positions:RotateHalf": (rotate_half_tables, ())})
"""The rotations gptzoo ships: how a step reads each one's tables."""


# --- the tables a plan looks lowerings up in ------------------------------------------------------

_warned: set[type] = set()
"""Classes whose decode_ops or decode_tables method has been warned about in this process."""


def legacy_message(cls: type) -> str:
    """The warning of a class that still lowers itself with a ``decode_ops`` method."""
    return (
        f"{cls.__module__}.{cls.__qualname__} describes its decoding step with a decode_ops method, the old form of "
        "gptzoo's native CPU decoding; register its lowering instead, from the plugin's "
        f"register_decode_lowerings(register) hook: register({cls.__qualname__}, lower), where lower(plan, module, "
        'src, dst, ...) does what decode_ops(plan, src, dst, ...) does (docs/plugins.md, "Fast CPU decoding")'
    )


def _warn_once(cls: type, message: str) -> None:
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(message, GptzooWarning, stacklevel=4)


def _legacy(cls: type) -> Row | None:
    """The lowering of a class of the previous contract: its ``decode_ops`` method (and ``decode_depends``)."""
    if "decode_ops" not in vars(cls):
        return None
    _warn_once(cls, legacy_message(cls))

    def lower(plan: DecodePlan, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        try:
            return module.decode_ops(plan, *args, **kwargs)
        except AttributeError as exc:  # a subclass of a built-in calling the decode_ops its parent had
            if exc.name not in ("decode_ops", "_decode_ops"):
                raise
            owner = "super()" if isinstance(exc.obj, super) else type(exc.obj).__name__
            raise Unsupported(
                f"{cls.__qualname__}.decode_ops calls {owner}.{exc.name}, which gptzoo's classes no longer have (they "
                f"are lowered through register_decode_lowerings); register the lowering of {cls.__qualname__} instead "
                '(docs/plugins.md, "Fast CPU decoding")'
            ) from None

    origin = Provenance(f"{class_key(cls)}.decode_ops", cls.__module__, "(contract 1)")
    return Row(class_key(cls), "", lower, origin, tuple(getattr(cls, "decode_depends", ())))


def _legacy_tables(cls: type) -> Row | None:
    """The rotary tables of a rotation of contract 6 or before: its ``decode_tables()`` method."""
    if "decode_tables" not in vars(cls):
        return None
    _warn_once(
        cls,
        f"{class_key(cls)} gives its rotary tables with a decode_tables method, the form before plugin contract 7; "
        "register them from the plugin's register_rotary_tables(register) hook instead: register(Class, tables), "
        'where tables(rotary) returns what decode_tables() returns (docs/plugins.md, "Fast CPU decoding")',
    )
    return Row(class_key(cls), "", lambda rotary: rotary.decode_tables(), BUILTIN)


class Lowerings:
    """The lowerings and rotary tables a plan reads: the built-in rows, then those the registry's plugins
    registered (gptzoo.class_table: a plugin's row for a class gptzoo lowers replaces gptzoo's only with
    ``override=True``; without, lowering that class is refused, naming both)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.table = ClassTable.of(LOWERINGS, BUILTIN_LOWERINGS, registry)
        self.rotary = ClassTable.of(ROTARY_TABLES, BUILTIN_ROTARY_TABLES, registry)

    def find(self, module: nn.Module) -> Lower:
        """The lowering of ``module``: see the module docstring.

        Raises:
            Unsupported: no lowering; forward hooks; a forward set on the instance; a class below the
                one lowered that overrides ``forward`` or a method its lowering depends on.
        """
        cls = type(module)
        if not runs_its_class_forward(module):
            raise Unsupported(f"{cls.__name__} has forward hooks or a forward of its own")
        match = self.table.find(cls, legacy=_legacy)
        if match is None:
            raise Unsupported(f"{cls.__module__}.{cls.__qualname__} has no decode lowering")
        if match.conflict is not None:
            raise Unsupported(
                f"{match.row.key} has a lowering of gptzoo's and one registered by {match.conflict.provenance}; "
                "register that one with override=True to replace gptzoo's"
            )
        if changed := match.changed(cls):
            c, name = changed
            raise Unsupported(
                f"{c.__name__} overrides {name} of {match.owner.__name__}, whose lowering would not describe it"
            )
        return self.table.value(match.row, "lowering", Unsupported)

    def rotary_tables(self, rotary: object) -> RotaryTables | None:
        """How a step reads ``rotary``'s tables: by the row of the first class of its MRO that has one
        (a plugin's, through register_rotary_tables, or its contract-6 ``decode_tables()``); None when
        there is none, or a class below that one overrides ``apply``."""
        match = self.rotary.find(type(rotary), legacy=_legacy_tables)
        if match is None or match.changed(type(rotary)):
            return None
        return self.rotary.value(match.row, "rotary tables", Unsupported)

    def lower(self, plan: DecodePlan, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """Append ``module``'s operations to ``plan`` with its lowering."""
        return self.find(module)(plan, module, *args, **kwargs)

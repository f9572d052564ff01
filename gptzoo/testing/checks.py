"""The conformance checks, one function per property, and which of them a component gets
(:func:`plan`). Each check raises :class:`Failed` with a line the plugin author can act on, or
:class:`Skipped`; returning means it passed (a returned str says what it covered)."""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from gptzoo import plugin_code
from gptzoo.compat import takes_no_arguments
from gptzoo.errors import GptzooError, describe_exception, exception_text
from gptzoo.hf.convert import FAMILIES
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.inference.quantize import Int8Linear, quantize
from gptzoo.inference.sampling import SamplerChain, pick_problem
from gptzoo.interfaces import Positions
from gptzoo.registry import Entry, Registry, show_plain
from gptzoo.testing import harness
from gptzoo.testing.harness import BATCH, CONTEXT, PLAIN, SEQ, SIZES, UNBIASED, VOCAB, Size
from gptzoo.testing.results import Failed, Skipped

aten = torch.ops.aten
ATOL = 1e-4
"""How far float32 logits of two computations that should agree may differ (cache vs recomputation)."""
CAUSAL_ATOL = 1e-6
"""How far the logits of a position may move when a later token changes (float32 rounding only)."""
INT8_RTOL = 0.05
"""How far (relative, by norm) a component's forward may move when its linears are int8: per-row
rounding moves a product by well under 1%."""
GRADIENT_BATCH = 8
"""Sequences of the gradient check's forward: enough tokens that a router reaches each of a few experts."""
NORM_GROWTH = 10.0
"""How much larger a norm's output may be for an input 1000 times larger."""


@dataclass
class Subject:
    """One component under test with one parameter set, and the test models built for it so far."""

    registry: Registry
    entry: Entry
    params: dict[str, Any]
    models: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.entry.kind

    def model(self, size: Size, partner: Entry | None = None, *, seed: int = 0) -> Any:
        """The test model at ``size`` with this component (and a partner with its defaults)."""
        key = (size, partner.name if partner else None, seed)
        if key not in self.models:
            choices = {self.kind: (self.entry, self.params)}
            if partner is not None:
                choices[partner.kind] = (partner, {})
            self.models[key] = harness.build_test_model(self.registry, size, choices, seed=seed)
        return self.models[key]

    def standalone(self, *, seed: int = 0) -> Any:
        key = ("standalone", seed)
        if key not in self.models:
            self.models[key] = harness.build_standalone(self.entry, self.params, seed=seed)
        return self.models[key]

    def module(self, size: Size = PLAIN, *, seed: int = 0) -> tuple[Any, nn.Module]:
        """(the test model or None, the component in it)."""
        if self.kind == "activation":
            return None, self.standalone(seed=seed)
        model = self.model(size, seed=seed)
        return model, harness.component_of(model, self.kind)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def forward(subject: Subject, model: Any, module: nn.Module, x: Tensor) -> Tensor:
    if model is None:
        return module(x)
    return harness.run_in_model(model, subject.kind, module, x)


# --- every module kind -------------------------------------------------------------------------------


def check_build(subject: Subject, size: Size = PLAIN) -> None:
    """It builds in the test model at this size (standalone: an activation, a sampler) and holds to its
    contract."""
    if subject.kind in ("activation", "sampler"):
        subject.standalone()
    else:
        subject.model(size)


def check_forward(subject: Subject, size: Size) -> None:
    """float32 and bfloat16 forwards keep the shape and dtype and produce no NaN."""
    model, module = subject.module(size)
    x = harness.model_input(subject.kind, size.n_embd, generator())
    expected = (BATCH, SEQ, VOCAB) if subject.kind == "position" else tuple(x.shape)
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16:
            if model is None:
                module = harness.in_bfloat16(module)
            else:
                model = harness.in_bfloat16(model)
                module = harness.component_of(model, subject.kind)
            x = x if subject.kind == "position" else x.to(dtype)
        with torch.no_grad():
            y = forward(subject, model, module, x)
        name = str(dtype).removeprefix("torch.")
        if tuple(y.shape) != expected:
            raise Failed(f"its {name} forward gave shape {tuple(y.shape)}, expected {expected}")
        if y.dtype != dtype:
            raise Failed(f"its {name} forward gave {y.dtype} for {name} input; keep the input's dtype")
        if torch.isnan(y).any():
            raise Failed(f"its {name} forward produced NaN")


def check_safetensors(subject: Subject) -> str | None:
    """Its state dict, saved with safetensors and loaded into a freshly built copy (another seed, every
    parameter shifted), gives the same outputs."""
    model, module = subject.module()
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    if not state:
        return "it has no state to save"
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "component.safetensors"
        try:
            save_file(state, str(path))
        except Exception as exc:  # safetensors refuses shared or non-contiguous tensors
            raise Failed(f"its state dict cannot be saved with safetensors: {harness.one_line(str(exc))}") from None
        fresh_model, fresh = subject.module(seed=1)
        if fresh_model is not None:
            fresh_model.load_state_dict(model.state_dict())  # the rest of the model as the original's
        with torch.no_grad():
            for p in fresh.parameters():
                p.add_(1.0)
        try:
            fresh.load_state_dict(load_file(str(path)))
        except RuntimeError as exc:
            raise Failed(f"its state dict does not load into a fresh copy: {harness.one_line(str(exc))}") from None
    with torch.no_grad():
        expected, got = forward(subject, model, module, x), forward(subject, fresh_model, fresh, x)
    subject.models.pop((PLAIN, None, 1), None)
    subject.models.pop(("standalone", 1), None)
    if not torch.equal(expected, got):
        raise Failed(
            "a fresh copy loaded from its saved state dict gives other outputs: state its output depends on is "
            "not in the state dict (register such a buffer persistent, or compute it from the parameters)"
        )
    return None


def _expresses(family: Any, config: dict[str, Any]) -> bool:
    """Whether ``family`` has a place for every config.json field a component gives (else it refuses it)."""
    fields = {*family.known, *family.required, *family.per_layer, *family.implied}
    return all(family.renames.get(k, k) in fields for k in config)


def check_hf_layouts(subject: Subject) -> str | None:
    """For every Hugging Face layout that maps it (gptzoo.hf.layouts: the built-ins', those plugins
    register), the maps cover its state dict exactly and export then import gives every tensor back; its
    config gives None or a dict of JSON values."""
    _, module = subject.module()
    state = module.state_dict()
    mapped = []
    families = {f.layout: f for f in FAMILIES.values()}  # one family per layout
    for layout, family in families.items():
        layouts = family.layouts(subject.registry)
        if layouts.find(module) is None:
            continue
        config = layouts.config(module)
        if (
            config is not None
            and isinstance(config, dict)
            and not any(_expresses(f, config) for f in FAMILIES.values() if f.layout == layout)
        ):
            continue  # a feature no family of this layout has a field for: export refuses it by that field
        if config is not None and not (isinstance(config, dict) and all(isinstance(k, str) for k in config)):
            raise Failed(f"its {layout!r} layout's config gave {show_plain(config)}, not None or a dict of fields")
        try:
            json.dumps(config)
        except (TypeError, ValueError):
            raise Failed(
                f"its {layout!r} layout's config holds a value that is not JSON (config.json is JSON)"
            ) from None
        maps = layouts.weights(module)
        if isinstance(maps, str):
            continue
        if not all(isinstance(m, TensorMap) for m in maps):
            raise Failed(f"its {layout!r} layout's weights gave {show_plain(maps)}, not None or a list of TensorMap")
        ours = [m.ours for m in maps]
        missing, extra = sorted(set(state) - set(ours)), sorted(set(ours) - set(state))
        if missing:
            raise Failed(f"its {layout!r} layout leaves {', '.join(missing)} of its state dict unmapped")
        if extra:
            raise Failed(f"its {layout!r} layout maps {', '.join(extra)}, which its state dict lacks")
        twice = sorted({name for name in ours if ours.count(name) > 1})
        if twice:
            raise Failed(f"its {layout!r} layout maps {', '.join(twice)} more than once")
        for m in maps:
            if not torch.equal(m.load(m.save(state[m.ours])), state[m.ours]):
                raise Failed(f"its {layout!r} layout: {m.ours} does not come back from export then import")
        mapped.append(layout)
    return f"maps {', '.join(mapped)}" if mapped else "no Hugging Face layout maps it"


# --- mlps and attentions ----------------------------------------------------------------------------------


def sdpa_cpu_flops(query: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...], *args, **kwargs) -> int:
    """FlopCounterMode's count of the CPU scaled_dot_product_attention kernel, which it does not know
    (it counts nothing for it): as it counts the CUDA kernels, Q K^T and att @ V over the query heads,
    the full square."""
    b, h, s_q, d = query
    s_k, d_v = key[2], value[3]
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v


def counted_flops(run: Callable[[], Any]) -> int:
    with (
        torch.no_grad(),
        FlopCounterMode(
            display=False, custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu_flops}
        ) as counter,
    ):
        run()
    return counter.get_total_flops()


def own_work(subject: Subject, model: Any, module: nn.Module, x: Tensor) -> object:
    """What one cache-less forward of the model runs of the component: its forward, or for a position
    what the model asks of it (its embedding of the positions, and the attention context it gives)."""
    if subject.kind != "position":
        return forward(subject, model, module, x)
    pos = Positions.plain(0, x.shape[1], x.device)
    return module.embed(pos.queries), model.attention_context(pos, torch.float32, module)


def check_flops(subject: Subject) -> str:
    """flops(batch, seq_len) equals what FlopCounterMode counts over a cache-less forward (for a position:
    over what the model asks of it in one)."""
    model, module = subject.module()
    declared = module.flops(BATCH, SEQ)
    if not (isinstance(declared, dict) and all(isinstance(k, str) for k in declared)):
        raise Failed(f"flops({BATCH}, {SEQ}) gave {show_plain(declared)}, not a dict of part name -> FLOPs")
    bad = [k for k, v in declared.items() if type(v) is not int or v < 0]
    if bad:
        raise Failed(f"flops({BATCH}, {SEQ})[{bad[0]!r}] is {show_plain(declared[bad[0]])}, not an int >= 0")
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
    counted = counted_flops(lambda: own_work(subject, model, module, x))
    total = sum(declared.values())
    if total != counted:
        raise Failed(
            f"flops({BATCH}, {SEQ}) declares {total} FLOPs ({declared}), FlopCounterMode counts {counted} for a "
            "cache-less forward over those tokens; count executed matmul FLOPs, 1 multiply-add = 2, attention scores "
            "over the full T x T square"
        )
    return f"{total} FLOPs"


def in_copy(subject: Subject) -> tuple[Any, nn.Module, nn.Module]:
    """A deep copy of the test model (or the standalone component): (the model or None, the component
    in it, the copy as a whole), to change without touching the models the other checks share."""
    model, module = subject.module()
    if model is None:
        copied = copy.deepcopy(module)
        return None, copied, copied
    copied = copy.deepcopy(model)
    return copied, harness.component_of(copied, subject.kind), copied


def check_gradients(subject: Subject) -> str:
    """One backward pass of a training forward over GRADIENT_BATCH sequences gives every parameter a
    nonzero gradient (a parameter forward never uses, such as a norm's weight it forgets to multiply
    by, or one it uses only through a step without a gradient, such as a router read only by topk's
    indices, gets none; so does an expert no token is routed to). The parameters are moved off their
    initialization first, so that a zero-initialized one (a ReZero gate) does not hide the others."""
    model, module, target = in_copy(subject)
    params = dict(module.named_parameters())
    if not params:
        return "no parameters"
    noise = generator(2)
    with torch.no_grad():
        for p in params.values():
            p.add_(0.1 * torch.randn(p.shape, generator=noise).to(p.dtype))
    target.train()
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator(), batch=GRADIENT_BATCH)
    with torch.enable_grad():  # the kit runs its checks without
        y = forward(subject, model, module, x)
        if y.requires_grad:  # else no parameter reached it
            (y.float() * torch.randn(y.shape, generator=generator(1))).sum().backward()
    missed = [name for name, p in params.items() if p.requires_grad and (p.grad is None or not p.grad.any())]
    if missed:
        raise Failed(
            f"its parameter {missed[0]!r}{f' (and {len(missed) - 1} more)' if len(missed) > 1 else ''} got no "
            "gradient from a training forward: forward does not use it, or only through a step without a gradient "
            "(an index, a comparison); use it, or do not make it a parameter"
        )
    return f"{len(params)} parameters reached"


def check_int8(subject: Subject) -> str:
    """Under ``--dtype int8`` (every plain nn.Linear of the test model an Int8Linear, but those a
    component keeps in float: gptzoo.inference.hooks.register_quantized_linears) the component's forward
    runs and stays within INT8_RTOL of float32's (relative to its norm)."""
    model, module = subject.module()
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
    with torch.no_grad():
        expected = forward(subject, model, module, x).float()
    q_model, q_module, target = in_copy(subject)
    quantize(target, "int8", subject.registry)
    quantized = sum(type(m) is Int8Linear for m in q_module.modules())
    try:
        with torch.no_grad():
            got = forward(subject, q_model, q_module, x).float()
    except Exception as exc:
        raise Failed(
            f"under --dtype int8 its forward raised {harness.one_line(describe_exception(exc))}: call its linears "
            "(an Int8Linear's weight reads as the dequantized weight), or register its quantized linears as False "
            "(or the paths of those it may have quantized) with register_quantized_linears"
        ) from None
    error = float((got - expected).norm() / expected.norm().clamp_min(1e-12))
    if not got.isfinite().all() or not error <= INT8_RTOL:
        raise Failed(
            f"under --dtype int8 its forward is {error:.3g} away from float32's (relative), more than int8's rounding "
            f"({INT8_RTOL}) explains: read each linear's weight through the linear, or keep it in float with "
            "register_quantized_linears"
        )
    return f"{quantized} linear{'s' if quantized != 1 else ''} in int8, {error:.1e} from float32"


def check_norm(subject: Subject) -> str:
    """A norm normalizes each position on its own: changing one position's input leaves the others'
    outputs as they were, and an input 1000 times larger gives an output at most 10 times larger (a
    norm that does not divide by its input's scale gives 1000 times)."""
    model, module = subject.module()
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
    changed = x.clone()
    changed[:, -1] = torch.randn(changed[:, -1].shape, generator=generator(3))
    with torch.no_grad():
        y, y_changed, y_large = (forward(subject, model, module, v) for v in (x, changed, 1000 * x))
    moved = (y_changed[:, :-1] - y[:, :-1]).abs().max()
    if moved > CAUSAL_ATOL:
        raise Failed(
            f"changing the input at position {SEQ} moved the outputs at other positions by up to {float(moved):.3g}: "
            "normalize each position over its features only, never across positions (that leaks later tokens)"
        )
    growth = float(y_large.float().pow(2).mean().sqrt() / y.float().pow(2).mean().sqrt().clamp_min(1e-12))
    if not growth <= NORM_GROWTH:
        raise Failed(
            f"an input 1000 times larger gave an output {growth:.4g} times larger (root mean square): it does not "
            "normalize; divide by the input's scale (its RMS, or its standard deviation)"
        )
    return f"output x{growth:.3g} for input x1000"


def check_accounting(subject: Subject) -> str:
    """``active_parameters()`` is an int between 0 and the component's parameters; ``aux_losses()``
    after a training forward is a dict of finite scalar tensors that reach the parameters' gradients."""
    model, module = subject.module()
    said = []
    if callable(getattr(module, "active_parameters", None)):
        total = sum(p.numel() for p in module.parameters())
        active = module.active_parameters()
        if type(active) is not int or not 0 <= active <= total:
            raise Failed(
                f"active_parameters() gave {show_plain(active)}, not an int between 0 and its {total} parameters"
            )
        said.append(f"{active} of {total} parameters active")
    if callable(getattr(module, "aux_losses", None)):
        module.train()
        x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
        with torch.enable_grad():  # the kit runs its checks without
            own_work(subject, model, module, x)
            losses = module.aux_losses()
        if not (isinstance(losses, dict) and all(isinstance(k, str) for k in losses)):
            raise Failed(f"aux_losses() gave {show_plain(losses)}, not a dict of name -> scalar tensor")
        for name, loss in losses.items():
            if not (isinstance(loss, Tensor) and loss.dim() == 0 and torch.isfinite(loss)):
                raise Failed(f"aux_losses()[{name!r}] is {show_plain(loss)}, not a finite scalar tensor")
            if not loss.requires_grad:
                raise Failed(f"aux_losses()[{name!r}] is not in the autograd graph; return the tensor forward computed")
        said.append(f"aux losses {', '.join(losses) or 'none'}")
    return "; ".join(said)


def check_stats(subject: Subject) -> str:
    """``stats()`` after a training forward is a dict of finite float tensors by identifier, each a scalar or
    a 1-D share (non-negative, summing to 1), under names the training record leaves free (contract 5)."""
    from gptzoo.training.stats import stat_problem

    model, module = subject.module()
    if not takes_no_arguments(module.stats):
        raise Skipped("its stats takes arguments: a method of its own, not contract 5's stats(), which training calls")
    module.train()
    x = harness.model_input(subject.kind, PLAIN.n_embd, generator())
    own_work(subject, model, module, x)
    reported = module.stats()
    if not (isinstance(reported, dict) and all(isinstance(k, str) for k in reported)):
        raise Failed(f"stats() gave {show_plain(reported)}, not a dict of name -> tensor")
    said = []
    for name, value in reported.items():
        problem = stat_problem(name, value)
        if problem is not None:
            raise Failed(f"stats(): {problem}")
        shown = [round(v, 4) for v in value.reshape(-1)[:8].tolist()] if value.dim() else round(float(value), 4)
        if not torch.isfinite(value).all():
            raise Failed(f"stats()[{name!r}] holds non-finite values: {shown}")
        total = float(value.double().sum())
        if value.dim() == 1 and (bool((value < 0).any()) or abs(total - 1) > 1e-4):
            raise Failed(
                f"stats()[{name!r}] is 1-D but not a share: its entries {shown} sum to {total:.4g} (a share's are "
                "non-negative and sum to 1)"
            )
        said.append(name if value.dim() == 0 else f"{name} ({value.numel()} shares)")
    return f"stats {', '.join(said) or 'none'}"


def check_decode_cost(subject: Subject) -> str:
    """``decode_cost(cache_len, dtype)`` is ``{"flops": int, "bytes": int}`` whose FLOPs equal what
    FlopCounterMode counts of the component's share of decoding one token after cache_len cached ones
    (an attention's step with its cache filled, a position's embedding and attention context for it,
    another kind's forward over one token), and whose bytes hold at least an attention's cache."""
    from gptzoo.decode_cost import component_decode_cost

    model, module = subject.module()
    cache_len, dtype = SEQ, torch.float32
    try:
        cost = component_decode_cost(module, cache_len, dtype)
    except GptzooError as e:
        raise Failed(str(e)) from None
    x = torch.randn(1, cache_len + 1, PLAIN.n_embd, generator=generator())
    step = Positions.plain(cache_len, 1, x.device)
    if subject.kind == "attention":
        cache = module.init_cache(1, cache_len + 1, device="cpu", dtype=dtype)
        with torch.no_grad():
            module(x[:, :cache_len], model.attention_context(Positions.plain(0, cache_len, x.device), dtype), cache)
        counted = counted_flops(lambda: module(x[:, cache_len:], model.attention_context(step, dtype), cache))
        least = module.kv_bytes(1, cache_len, dtype)
        if cost["bytes"] < least:
            raise Failed(
                f"decode_cost({cache_len}, {dtype}) reads {cost['bytes']} bytes, less than its cache of {least} "
                f"(kv_bytes(1, {cache_len}, {dtype}))"
            )
    elif subject.kind == "position":
        counted = counted_flops(lambda: (module.embed(step.queries), model.attention_context(step, dtype, module)))
    else:
        counted = counted_flops(lambda: module(x[:, cache_len:]))
    if cost["flops"] != counted:
        raise Failed(
            f"decode_cost({cache_len}, {dtype}) declares {cost['flops']} FLOPs, FlopCounterMode counts {counted} "
            f"for one token after {cache_len} cached ones; count executed matmul FLOPs, 1 multiply-add = 2"
        )
    return f"{cost['flops']} FLOPs, {cost['bytes']} bytes at {cache_len} cached"


# --- attentions ------------------------------------------------------------------------------------------


def check_kv_bytes(subject: Subject) -> None:
    """kv_bytes(batch, max_len, dtype) is the nbytes of the cache init_cache allocates, whose max_len
    is the one asked for."""
    _, attn = subject.module(harness.pair_size({subject.kind: (subject.entry, subject.params)}))
    max_len = decode_length(subject)
    for dtype in (torch.float32, torch.bfloat16):
        cache = attn.init_cache(BATCH, max_len, device="cpu", dtype=dtype)
        said, held = attn.kv_bytes(BATCH, max_len, dtype), cache.nbytes
        if said != held:
            raise Failed(
                f"kv_bytes({BATCH}, {max_len}, {dtype}) says {show_plain(said)} bytes, the cache init_cache "
                f"allocates holds {show_plain(held)} (its nbytes)"
            )
        if cache.max_len != max_len:
            raise Failed(
                f"init_cache({BATCH}, {max_len}) gave a cache whose max_len is {show_plain(cache.max_len)}; max_len "
                "is how many positions it accepts in all"
            )


# --- attention x position pairings ------------------------------------------------------------------


def small_ints(params: Mapping[str, Any]) -> list[int]:
    return [v for v in params.values() if type(v) is int and 0 < v < CONTEXT]


def decode_length(subject: Subject) -> int:
    """How long the cache checks' sequences are: past twice the largest small int parameter (a window;
    given, or the factory's default), within the context."""
    sig = plugin_code.signature(subject.entry)
    defaults = {} if sig is None else {n: p.default for n, p in sig.parameters.items() if p.default is not p.empty}
    largest = max(small_ints({**defaults, **subject.params}), default=0)
    return min(CONTEXT, max(12, PREFILL + 2 * largest + 2))


PREFILL = 3


def pair_model(subject: Subject, partner: Entry) -> Any:
    """The test model with the component and its partner; a partner that is broken itself (its own
    checks say so) skips the check."""
    size = harness.pair_size({subject.kind: (subject.entry, subject.params), partner.kind: (partner, {})})
    try:
        return subject.model(size, partner)
    except Failed as exc:
        if _builds_alone(subject.registry, partner, size):
            raise
        raise Skipped(f"{partner.kind} {partner.name!r} does not build at size {size.label} ({exc})") from None


def _builds_alone(registry: Registry, entry: Entry, size: Size) -> bool:
    try:
        harness.build_test_model(registry, size, {entry.kind: (entry, {})}, seed=0)
    except (Failed, Skipped):
        return False
    return True


def tokens(length: int, batch: int = BATCH, seed: int = 0) -> Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=generator(seed))


def check_causality(subject: Subject, partner: Entry) -> str:
    """Changing token t+1 never changes the logits at positions <= t (beyond float32 rounding: no later
    token may matter at all, however little)."""
    model = pair_model(subject, partner)
    length = decode_length(subject)
    base = tokens(length, batch=1)
    changed = base.repeat(length, 1)  # row 0 is the original, row i changes token i
    rows = torch.arange(1, length)
    changed[rows, rows] = (changed[rows, rows] + 1) % VOCAB
    with torch.no_grad():
        logits = model(changed)
    for i in range(1, length):
        diff = (logits[i, :i] - logits[0, :i]).abs().amax(dim=-1)
        if (diff > CAUSAL_ATOL).any():
            t = int((diff > CAUSAL_ATOL).nonzero()[0])
            raise Failed(
                f"changing token {i} changed the logits at position {t}: a query sees a later key; mask "
                "every key after the query"
            )
    return f"{length} tokens"


def _first_difference(expected: Tensor, got: Tensor, real: Tensor | None = None) -> tuple[int, int] | None:
    """(row, position) of the first logits (B, T, V) that differ by more than ATOL (at real tokens)."""
    diff = (expected - got).abs().amax(dim=-1)  # (B, T)
    if real is not None:
        diff = diff * real
    bad = (diff > ATOL).nonzero()
    if not len(bad):
        return None
    row, t = (int(v) for v in bad[bad[:, 1].argmin()])
    return row, t


def _decode(model: Any, idx: Tensor, prefill: int, mask: Tensor | None = None) -> Tensor:
    cache = model.init_cache(idx.shape[0], idx.shape[1])
    steps = [model(idx[:, :prefill], cache, attention_mask=None if mask is None else mask[:, :prefill])]
    steps += [model(idx[:, t : t + 1], cache) for t in range(prefill, idx.shape[1])]
    return torch.cat(steps, dim=1)


def check_cache(subject: Subject, partner: Entry) -> str:
    """A prefill then one-token decode steps with the KV cache give the logits of one forward without it."""
    model = pair_model(subject, partner)
    length = decode_length(subject)
    idx = tokens(length)
    with torch.no_grad():
        expected, got = model(idx), _decode(model, idx, PREFILL)
    found = _first_difference(expected, got)
    if found:
        raise Failed(
            f"decoding with the KV cache differs from recomputing without it at position {found[1]} (a prefill of "
            f"{PREFILL} tokens, then one token at a time to {length})"
        )
    return f"decoded {length - PREFILL} tokens after a prefill of {PREFILL}"


PAD = 3
"""How many padding tokens the first row of the padded cache check has on the left."""


def check_cache_padded(subject: Subject, partner: Entry) -> str:
    """As check_cache, for a left-padded batch (attention_mask) whose first row starts later."""
    model = pair_model(subject, partner)
    length = decode_length(subject)
    idx = tokens(length)
    mask = torch.ones_like(idx)
    mask[0, :PAD] = 0
    with torch.no_grad():
        expected, got = model(idx, attention_mask=mask), _decode(model, idx, PREFILL + PAD, mask)
    found = _first_difference(expected, got, mask)
    if found:
        raise Failed(
            f"with left padding ({PAD} tokens before row 1), decoding with the KV cache differs from recomputing "
            f"without it in row {found[0] + 1} at position {found[1]}"
        )
    return f"decoded {length - PREFILL - PAD} tokens after a padded prefill"


def check_cache_rows(subject: Subject, partner: Entry) -> str:
    """Sequences prefilled in caches of their own, then gathered into one batch by their layer caches'
    movers (gptzoo.inference.batching.gather, as ``gptzoo serve`` batches them: row 2 of a two-row cache
    and row 1 of another, of different lengths, right-aligned), decode as each does alone. Optional: a
    cache no mover knows is served one sequence at a time, which the cache checks cover."""
    from gptzoo.inference.batching import Row, gather, unbatchable

    model = pair_model(subject, partner)
    length = decode_length(subject)
    idx = tokens(length, batch=3)
    longer = PREFILL + 2
    with torch.no_grad():
        expected = model(idx)
        pair, lone = model.init_cache(2, length), model.init_cache(1, length)
        why = unbatchable(pair, subject.registry)
        if why is not None:
            return f"served one sequence at a time: {why}"
        model(idx[:2, :PREFILL], pair)
        model(idx[2:, :longer], lone)
        cache = gather(model, [Row(lone, 0, longer), Row(pair, 1, PREFILL)], length, subject.registry)
        for step in range(length - longer):
            at = (longer + step, PREFILL + step)  # each row's next position
            logits = model(torch.stack([idx[2, at[0]], idx[1, at[1]]])[:, None], cache)[:, -1]
            for row, (seq, t) in enumerate(((2, at[0]), (1, at[1]))):
                if (logits[row] - expected[seq, t]).abs().amax() > ATOL:
                    raise Failed(
                        f"two sequences gathered into one batch by the mover of {type(cache.layers[0]).__name__} "
                        f"(register_cache_rows) decode otherwise than alone: batch row {row + 1} differs at "
                        f"position {t} (rows of {longer} and {PREFILL} tokens, right-aligned); fix the mover"
                    )
    return f"decoded {length - longer} steps of two sequences ({longer} and {PREFILL} tokens) gathered into one batch"


def check_decode_plan(subject: Subject, size: Size = PLAIN) -> str:
    """Decoding steps through the native plan (gptzoo.inference.decode_plan) give the logits of the
    eager steps, each component lowered by the lowering of its class (gptzoo.inference.lowerings: the
    built-in ones and those the registry's plugins register); where the plan cannot describe a
    component (no lowering: optional), it says why, and the split plan that generate uses, the
    component's eager forward within the native step, must give those logits too."""
    from gptzoo.inference.decode_plan import compile_step
    from gptzoo.inference.native import library, unavailable_reason

    if library() is None:
        raise Skipped(f"native kernels unavailable: {unavailable_reason()}")
    model = subject.model(size)
    length = decode_length(subject)
    idx = tokens(length)
    with torch.no_grad():
        expected = _decode(model, idx, PREFILL)
        cache = model.init_cache(idx.shape[0], idx.shape[1])
        steps = [model(idx[:, :PREFILL], cache)]
        step, why = compile_step(model, cache, idx.shape[0], registry=subject.registry)
        split = step is None
        if split:  # optional: the component then runs its eager forward within the native step
            step, split_why = compile_step(model, cache, idx.shape[0], registry=subject.registry, split=True)
            if step is None:  # the model decodes with its eager forward, which check_cache covers
                return f"decodes with its eager forward: {split_why}"
        steps += [step(idx[:, t : t + 1]) for t in range(PREFILL, length)]
    found = _first_difference(expected, torch.cat(steps, dim=1))
    if found and split:
        raise Failed(
            f"decoding with its eager forward within the native step ({why}) differs from the eager forward at "
            f"position {found[1]} (a prefill of {PREFILL} tokens, then one token at a time to {length}); report it to "
            "gptzoo (the split plan must compute what the eager forward computes)"
        )
    if found:
        raise Failed(
            f"decoding through its lowering differs from its eager forward at position {found[1]} (a prefill of "
            f"{PREFILL} tokens, then one token at a time to {length}); fix the lowering or remove it"
        )
    if split:
        return f"decoded {length - PREFILL} tokens with its eager forward within the native step: {why}"
    return f"decoded {length - PREFILL} tokens through the native plan"


# --- samplers --------------------------------------------------------------------------------------------

FORBIDDEN = ((0, 0), (0, 5), (1, 3))
"""(row, token) pairs the sampler checks set to -inf."""


def sampler_logits() -> Tensor:
    logits = torch.randn(BATCH, VOCAB, generator=generator())
    for row, token in FORBIDDEN:
        logits[row, token] = float("-inf")
    return logits


def check_sampler(subject: Subject) -> None:
    """logits (B, V) -> (B, V): -inf stays -inf, at least one finite token per row, no NaN; a picking
    step's pick gives (B,) long."""
    step = subject.standalone()
    logits = sampler_logits()
    ids = tokens(3)
    out = SamplerChain([step]).transform(logits.clone(), ids, generator=generator())
    if not isinstance(out, Tensor) or tuple(out.shape) != (BATCH, VOCAB):
        shape = tuple(out.shape) if isinstance(out, Tensor) else show_plain(out)
        raise Failed(f"it turned logits of shape {(BATCH, VOCAB)} into {shape}; return logits of the same shape")
    for row, token in FORBIDDEN:
        if not out[row, token].isneginf():
            raise Failed(f"it turned the -inf logit of token {token} in row {row + 1} into {float(out[row, token])}")
    if out.isnan().any():
        raise Failed("it produced NaN logits")
    if not out.isfinite().any(dim=-1).all():
        raise Failed("it left a row without any finite logit; keep at least one token possible")
    if step.picks:
        problem = pick_problem(step.pick(out, generator()), out)
        if problem is not None:
            raise Failed(problem)


def check_seeded(subject: Subject) -> None:
    """Two generations of 8 tokens by a chain of this step with the same torch.Generator seed, reset
    before each as generate resets it, pick the same tokens."""
    chain = SamplerChain([subject.standalone()])
    logits, ids = sampler_logits(), tokens(3)
    runs = []
    for global_seed in (1, 2):  # another global seed each time: a step must draw from the generator
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(global_seed)
            gen = generator(1234)
            chain.reset()
            runs.append(torch.stack([chain(logits.clone(), ids, gen) for _ in range(8)]))
    if not torch.equal(*runs):
        raise Failed(
            "two generations with the same torch.Generator seed picked different tokens: draw random numbers only "
            "from the generator the chain passes (to pick, and to __call__ when it takes generator=), and forget "
            "per-generation state in reset(), which the chain calls before each generation"
        )


PADDING = 3
"""Positions of left padding in the padding check."""


def check_padding(subject: Subject) -> str:
    """A prompt left-padded as generate pads a batch (the row's first token repeated, ``real`` False
    there) gets the logits and the pick it gets without the padding."""
    chain = SamplerChain([subject.standalone()])
    logits = sampler_logits()[:1]
    plain = tokens(6)[:1]
    padded = torch.cat([plain[:, :1].expand(1, PADDING), plain], dim=1)
    real = torch.cat([torch.zeros(1, PADDING, dtype=torch.bool), torch.ones_like(plain, dtype=torch.bool)], dim=1)
    runs = []
    for ids, mask in ((plain, None), (padded, real)):
        chain.reset()
        out = chain.transform(logits.clone(), ids, real=mask, generator=generator(7))
        chain.reset()
        runs.append((out, chain(logits.clone(), ids, generator(7), real=mask)))
    (expected, expected_pick), (got, got_pick) = runs
    differs = ~torch.isclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    uses = "it takes real= but counts" if "real" in chain.keywords[0] else "it counts"
    fix = "count only the positions where real is True (take real= in __call__)"
    if differs.any():
        token = int(differs.nonzero()[0, 1])
        raise Failed(
            f"a prompt left-padded by {PADDING} positions (holding its first token, as generate pads a batch) changed "
            f"the logit of token {token} from {float(expected[0, token]):.6g} to {float(got[0, token]):.6g}: {uses} "
            f"the padding; {fix}"
        )
    if not torch.equal(got_pick, expected_pick):
        raise Failed(
            f"a prompt left-padded by {PADDING} positions picked token {int(got_pick[0])}, not "
            f"{int(expected_pick[0])} as without the padding: {uses} the padding; {fix}"
        )
    return f"takes {', '.join(chain.keywords[0])}" if chain.keywords[0] else "takes neither real nor generator"


# --- which checks a component gets -------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One check of one component: its name (with variant) and what runs it."""

    entry: Entry
    check: str
    run: Callable[[], str | None]


def variant(name: str, *parts: str) -> str:
    parts = tuple(p for p in parts if p)
    return f"{name}[{','.join(parts)}]" if parts else name


def examples_of(entry: Entry) -> tuple[list[dict[str, Any]], str | None]:
    """The factory's valid ``examples`` and the problem with them (None when they are fine)."""
    try:
        factory = entry.factory
    except GptzooError as exc:  # a factory registered by reference that cannot be imported
        return [], exception_text(exc)
    try:
        examples = getattr(factory, "examples", None)
    except Exception as exc:
        return [], f"reading examples raised {harness.one_line(repr(exc))}"
    if examples is None:
        return [], None
    if not isinstance(examples, list):
        return [], f"examples is {show_plain(examples)}, not a list of dicts of parameters"
    for i, example in enumerate(examples):
        if not isinstance(example, dict) or not all(isinstance(k, str) for k in example):
            return [], f"examples[{i}] is {show_plain(example)}, not a dict of parameter name -> value"
    return [dict(e) for e in examples], None


def plan(registry: Registry, entry: Entry) -> list[Planned]:
    """Every check of one component, in order."""
    examples, problem = examples_of(entry)
    planned = [Planned(entry, "examples", functools.partial(_examples_result, problem, len(examples)))]
    for params in ({}, *examples):
        planned.extend(_checks(Subject(registry, entry, params)))
    return planned


def _examples_result(problem: str | None, count: int) -> str:
    if problem:
        raise Failed(problem)
    return f"{count} example parameter set{'s' if count != 1 else ''}"


def declares(entry: Entry, member: str) -> bool:
    """Whether the component's class defines the optional ``member``; False for a factory that cannot be
    imported (its build check says why)."""
    try:
        factory = entry.factory
    except GptzooError:
        return False
    return callable(getattr(factory, member, None))


def _checks(subject: Subject) -> Iterator[Planned]:
    kind, tag = subject.kind, harness.label(subject.params)

    def add(name: str, fn: Callable[..., str | None], *args: Any) -> Planned:
        return Planned(subject.entry, variant(name, *args_labels(args), tag), functools.partial(fn, subject, *args))

    if kind == "sampler":
        yield add("build", check_build)
        yield add("sampler", check_sampler)
        yield add("seeded", check_seeded)
        yield add("padding", check_padding)
        return
    if kind == "activation":  # no size of its own
        yield add("build", check_build)
        yield add("forward", check_forward, PLAIN)
    else:
        for size in SIZES:
            yield add("build", check_build, size)
            yield add("forward", check_forward, size)
    yield add("gradients", check_gradients)
    yield add("int8", check_int8)
    if kind == "norm":
        yield add("normalizes", check_norm)
    yield add("safetensors", check_safetensors)
    yield add("hf_layouts", check_hf_layouts)
    if kind in ("mlp", "attention") or declares(subject.entry, "flops"):
        yield add("flops", check_flops)  # required of mlps and attentions, optional for the others
    if declares(subject.entry, "active_parameters") or declares(subject.entry, "aux_losses"):
        yield add("accounting", check_accounting)
    if declares(subject.entry, "stats"):
        yield add("stats", check_stats)
    if declares(subject.entry, "decode_cost"):
        yield add("decode_cost", check_decode_cost)
    if kind == "attention":
        yield add("kv_bytes", check_kv_bytes)
    yield add("decode_plan", check_decode_plan)
    yield add("decode_plan", check_decode_plan, UNBIASED)  # a lowering that refuses biases is exercised here
    partner_kind = {"attention": "position", "position": "attention"}.get(kind)
    if partner_kind is None:
        return
    for partner in subject.registry.entries(partner_kind):
        for name, fn in (("causality", check_causality), ("cache", check_cache), ("cache-padded", check_cache_padded)):
            yield add(name, fn, partner)
        if kind == "attention":
            yield add("cache-rows", check_cache_rows, partner)


def args_labels(args: tuple[Any, ...]) -> list[str]:
    return [a.label if isinstance(a, Size) else a.name if isinstance(a, Entry) else str(a) for a in args]

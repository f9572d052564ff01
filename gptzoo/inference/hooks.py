"""The inference subsystem's hooks: what a plugin tells native decoding, continuous batching and weight
quantization about a component class. Each hook spec has its :class:`gptzoo.class_table.Intake`
(:data:`INTAKES`); the plugin manager adds both (gptzoo.plugin_manager.SUBSYSTEMS). The tables they
fill are read where they are used: lowerings and rotary tables by gptzoo.inference.lowerings, cache
movers by gptzoo.inference.batching, quantized linears by gptzoo.inference.quantize.

This module imports no torch: the plugin manager loads it for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gptzoo.class_table import Accepted, Intake
from gptzoo.errors import RegistryError
from gptzoo.hookspecs import hookspec
from gptzoo.registry import Provenance, Reference, show_plain


class RegisterLowering(Protocol):
    def __call__(
        self,
        component: type | str,
        lowering: Callable[..., Any] | str,
        *,
        depends: tuple[str, ...] = (),
        override: bool = False,
    ) -> None: ...


@hookspec
def register_decode_lowerings(register: RegisterLowering) -> None:
    """Register how components of a plugin's classes take part in a native CPU decoding step.

    ``register(component, lowering, *, depends=(), override=False)``:
        component: the class lowered, or a reference to it (``"gptzoo_dyt:DyT"``, so that
            registering imports nothing). Its instances, and those of subclasses that override
            neither ``forward`` nor a method in ``depends``, are lowered by ``lowering``.
        lowering: ``lower(plan, module, src, dst, **kwargs) -> None``, or a reference to it
            (imported when a model first decodes with it). It appends the module's operations
            through ``plan`` (gptzoo.inference.plan.DecodePlan; its children through ``plan.call``):
            norms, mlps and linear layers take ``src`` and ``dst`` Buffers (batch, width);
            activations also ``gated``; attentions also ``position`` (the step's PositionStep) and
            ``cache`` (the layer's own, from ``init_cache``). ``plan.refuse(reason)`` gives up: the
            module runs its eager forward within the step. It must compute what ``forward`` computes for one
            token per row (the conformance kit's ``decode_plan`` check compares them).
        depends: the class's methods besides ``forward`` that the lowering describes (an attention's
            ``attend``): a subclass that overrides one is not lowered by it.
        override: replace the lowering another plugin, or gptzoo, registered for the same class.
            Without it a class two plugins lower is an error naming both (the later plugin fails),
            and one gptzoo lowers keeps gptzoo's lowering (the plan refuses it, naming both).

    A component without a lowering runs its eager forward between the native calls of each step
    (generate's "native+eager" path, gptzoo.inference.paths.DecodePath). The previous
    contract, a ``decode_ops(plan, src, dst, ...)`` method on the class, still works, with one
    gptzoo.errors.GptzooWarning per class (docs/plugins.md, "Fast CPU decoding").
    """


def _lowering(
    provenance: Provenance, key: str, lowering: Callable[..., Any] | str, *, depends: tuple[str, ...] | list[str] = ()
) -> Accepted:
    what = f"{provenance} registered the lowering of {key}"
    return [
        (
            "",
            function(what, lowering, "lowering", "the function lower(plan, module, src, dst, ...)"),
            methods(what, depends),
        )
    ]


def function(what: str, value: object, noun: str, wanted: str) -> Callable[..., Any] | Reference:
    """A function a plugin registered, or a reference ``"module:attribute"`` to one (imported when first used)."""
    if isinstance(value, str):
        target = Reference.parse(str.__str__(value))
        if target is None:
            raise RegistryError(
                f"{what} with a reference that is not 'module:attribute': {show_plain(str.__str__(value))}"
            )
        return target
    if not callable(value):
        raise RegistryError(f"{what} with a {noun} that is not callable: {show_plain(value)}; pass {wanted}")
    return value


def methods(what: str, depends: object) -> tuple[str, ...]:
    if not isinstance(depends, (tuple, list)) or not all(type(name) is str and name.isidentifier() for name in depends):
        raise RegistryError(f"{what} with depends that are not method names: {show_plain(depends)}")
    return tuple(depends)


class RegisterRotaryTables(Protocol):
    def __call__(self, rotary: type | str, tables: Callable[[Any], Any] | str, *, override: bool = False) -> None: ...


@hookspec
def register_rotary_tables(register: RegisterRotaryTables) -> None:
    """Say how a native decoding step reads a plugin's rotation (contract 7).

    ``register(rotary, tables, *, override=False)``:
        rotary: the class of what a position's ``rotary(positions)`` returns (a subclass that overrides
            ``apply`` is not read by it), or its reference ``"module:Class"``.
        tables: ``tables(rotary) -> (cos, sin, in_float32)``, or a reference to it: the rotation of one
            position, cos and sin of ``rotary_dim`` each (float32), and whether q and k rotate in float32.
            The step rotates as the built-in RotateHalf does (halves of each head's first rotary_dim).

    Before contract 7 a rotation answered for itself with a ``decode_tables()`` method: that still works,
    with one GptzooWarning per class.
    """


def _rotary(provenance: Provenance, key: str, tables: Callable[..., Any] | str) -> Accepted:
    what = f"{provenance} registered the rotary tables of {key}"
    return [
        ("", function(what, tables, "tables function", "the function tables(rotary) -> (cos, sin, in_float32)"), ())
    ]


class RegisterCacheRows(Protocol):
    def __call__(self, cache: type | str, move: Callable[..., None] | str, *, override: bool = False) -> None: ...


@hookspec
def register_cache_rows(register: RegisterCacheRows) -> None:
    """Say how a layer cache class of a plugin's own moves a sequence's positions between caches, so that
    ``gptzoo serve`` batches sequences of different lengths on it (contract 6; gptzoo.inference.batching).

    Without it, a model whose attention returns a cache of its own class from ``init_cache`` is served
    correctly, one sequence at a time. The built-in cache classes are known to gptzoo.

    ``register(cache, move, *, override=False)``:
        cache: the cache class (exactly that class: a subclass may keep positions elsewhere), or its
            reference ``"module:Class"``.
        move: ``move(dst, i, dst_end, src, j, src_end, n)``, or its reference ``"module:function"``
            (imported when a batch first moves rows): make the ``n`` positions of ``src``'s row ``j``
            that end before index ``src_end`` those of ``dst``'s row ``i`` that end before ``dst_end``
            (both caches of that class, made by the same attention; ``dst`` is zeroed beforehand).
        override: replace gptzoo's mover of the class, or another plugin's (contract 7; a plugin written
            for an earlier contract replaces them without it).
    """


def _mover(provenance: Provenance, key: str, move: Callable[..., None] | str) -> Accepted:
    what = f"{provenance} registered how a cache moves rows for {key}"
    return [("", function(what, move, "mover", "the function move(dst, i, dst_end, src, j, src_end, n)"), ())]


class RegisterQuantizedLinears(Protocol):
    def __call__(self, component: type | str, linears: bool | tuple[str, ...], *, override: bool = False) -> None: ...


@hookspec
def register_quantized_linears(register: RegisterQuantizedLinears) -> None:
    """Say which of a component's linears ``--dtype int8`` and ``--dtype int4`` may quantize (contract 7;
    gptzoo.inference.quantize). Without it every plain ``nn.Linear`` inside a component may be.

    ``register(component, linears, *, override=False)``:
        component: the class (a subclass uses its nearest base class's), or its reference ``"module:Class"``.
        linears: True, every one; False, none (they stay in the model's dtype); or a tuple of their paths
            inside the component (``("q", "kv_a")``), those only. An Int8Linear's ``weight`` reads as the
            dequantized float32 weight, so a component that reads its linears' weights keeps working; one
            that cannot run on a quantized linear says so here, else ``--dtype int8`` refuses the model,
            naming it, after one token fails to run.

    Before contract 7 a component said this with a class attribute ``int8`` (contract 4): that still
    works, with one GptzooWarning per class.
    """


def _linears(provenance: Provenance, key: str, linears: bool | tuple[str, ...]) -> Accepted:
    if type(linears) is not bool and not (
        isinstance(linears, (tuple, list)) and all(type(path) is str and path for path in linears)
    ):
        raise RegistryError(
            f"{provenance} registered the quantized linears of {key} as {show_plain(linears)}; pass True, False or "
            "a tuple of the paths of its nn.Linear modules"
        )
    return [("", linears if type(linears) is bool else tuple(linears), ())]


LOWERINGS = Intake(
    "register_decode_lowerings", "a lowering", _lowering, lambda key, facet: f"lowering of {key}", depends=("forward",)
)
ROTARY_TABLES = Intake(
    "register_rotary_tables", "rotary tables", _rotary, lambda key, facet: f"rotary tables of {key}", depends=("apply",)
)
CACHE_ROWS = Intake(
    "register_cache_rows",
    "how a cache moves rows",
    _mover,
    lambda key, facet: f"mover of {key}",
    exact=True,
    replaced_before=7,
)
QUANTIZED_LINEARS = Intake(
    "register_quantized_linears",
    "quantized linears",
    _linears,
    lambda key, facet: f"quantized linears of {key}",
)
INTAKES = (LOWERINGS, ROTARY_TABLES, CACHE_ROWS, QUANTIZED_LINEARS)
"""This subsystem's intakes, read by the plugin manager."""

"""Running a registered component's own code: its factory, its signature and its optional ``check``,
and holding what the factory built to its kind's contract (gptzoo.hookspecs.CONTRACTS).

Built-ins are treated like any plugin. Whatever the code raises becomes one PluginError naming the
component and its plugin (distribution and version), and the fix: ``sys.exit`` and ``os._exit`` too
(``os._exit`` raises gptzoo.plugin_manager.PluginExit meanwhile, see
:func:`gptzoo.plugin_manager.exit_guard`). KeyboardInterrupt stays an interrupt. A GptzooError keeps
its message, prefixed by the component and plugin unless gptzoo itself registered the component (its
own messages already say what to fix). A factory registered by reference is imported before any of its
code runs (gptzoo.registry.Entry.factory), and a failure to import it is that PluginError, which names
the reference.

A component built with an older form of a member (gptzoo.compat) gets an adapter in its place and
one warning, or is refused, right after its factory returns (:func:`adapt_old_forms`).

torch is imported by the functions that inspect what a factory built (it is loaded by then), so that
validating a recipe's component names imports nothing heavy.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import traceback
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from gptzoo import compat
from gptzoo.defaults import WEIGHT_DTYPES
from gptzoo.errors import GptzooError, ParameterError, PluginError, exception_text
from gptzoo.hookspecs import CONTRACTS
from gptzoo.plugin_manager import describe_raised, exit_guard
from gptzoo.registry import GPTZOO_DISTRIBUTION, Entry, Reference, Registry, culprit, fix, show_plain
from gptzoo.untrusted import WEIGHT_DTYPES_TEXT, dtype_name

if TYPE_CHECKING:
    import torch
    from torch import nn


@contextmanager
def running(entry: Entry, what: str, *, user_errors: tuple[type[Exception], ...] = ()) -> Iterator[Callable[..., Any]]:
    """Run the entry's code, given its factory (imported first when registered by reference); what
    the code raises (but KeyboardInterrupt and ``user_errors``, which the caller reports) becomes a
    PluginError: ``{culprit} {what}: {what it raised}; {fix}``."""
    factory = entry.factory
    try:
        with exit_guard():
            yield factory
    except KeyboardInterrupt:
        raise
    except user_errors:
        raise
    except GptzooError as exc:
        if entry.provenance.distribution == GPTZOO_DISTRIBUTION:
            raise
        raise PluginError(f"{culprit(entry)}: {exception_text(exc)}") from exc
    except BaseException as exc:  # a plugin's code may raise anything, sys.exit and os._exit included
        raise PluginError(f"{culprit(entry)} {what}: {describe_raised(exc)}; {fix(entry)}") from exc


def build(entry: Entry, kwargs: Mapping[str, Any], *, user_errors: tuple[type[Exception], ...] = ()) -> Any:
    """``entry.factory(**kwargs)``; failures as :func:`running` says (``user_errors`` pass through).
    A ValueError, which the contracts say a factory raises for an out-of-range parameter, is a
    ParameterError naming the parameters the recipe gave (unless ``user_errors`` has it)."""
    try:
        with running(entry, "failed to build", user_errors=(*user_errors, ValueError)) as factory:
            built = factory(**kwargs)
    except ValueError as exc:
        if isinstance(exc, user_errors):
            raise
        raise ParameterError(refused(entry, kwargs, exc)) from exc
    adapt_old_forms(entry, built)
    return built


def adapt_old_forms(entry: Entry, built: object) -> None:
    """Give what a factory built the current form of every member it has in an older form
    (gptzoo.compat.CHANGES): an adapter in its place, with one GptzooWarning per entry, or a
    PluginError when the change cannot be adapted (or the plugin declares the newer contract)."""
    for change in compat.CHANGES:
        if entry.kind not in change.kinds:
            continue
        with running(entry, "built an object that cannot be inspected"):
            member = getattr(built, change.member, None)
            form = compat.form_of(member)
            old = form is not None and change.is_old(form)
        if not old:
            continue
        if problem := compat.refusal(entry, change):
            raise PluginError(problem)
        assert change.adapt is not None  # no refusal: the change has an adapter
        with running(entry, f"could not take an adapted {change.member}"):
            setattr(built, change.member, change.adapt(member))
        entry.warn(compat.adapted(entry, change))


def refused(entry: Entry, kwargs: Mapping[str, Any], exc: ValueError) -> str:
    """``attention 'windowed' from P refused window = 0: <its message>; change that parameter, ...``"""
    given_by_model = CONTRACTS[entry.kind].given_by_model
    params = {k: v for k, v in kwargs.items() if k not in given_by_model}
    with running(entry, "raised a ValueError that cannot be printed"):
        message = " ".join(exception_text(exc).split())
    structural = [arg for arg, _ in CONTRACTS[entry.kind].structural]
    if params:
        given = ", ".join(f"{k} = {show_plain(v)}" for k, v in params.items())
        change = (
            f"change {'that parameter' if len(params) == 1 else 'those parameters'}, or choose another {entry.kind}"
        )
    elif structural:
        given = (
            "the model's dimensions (" + ", ".join(f"{arg}={show_plain(kwargs.get(arg))}" for arg in structural) + ")"
        )
        change = f"change the model's dimensions, or choose another {entry.kind}"
    else:
        given, change = "its defaults", fix(entry)
    return f"{culprit(entry)} refused {given}: {message}; {change}"


def signature_problem(entry: Entry, signature: inspect.Signature) -> str | None:
    """Why the factory cannot take what the model passes to every factory of its kind (by keyword:
    CONTRACTS[kind].given_by_model), or None."""
    params = signature.parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    by_keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    contract = CONTRACTS[entry.kind]
    missing = [arg for arg in (*(a for a, _ in contract.structural), *contract.components) if arg not in by_keyword]
    if not missing:
        return None
    them = "it" if len(missing) == 1 else "them"
    return (
        f"{culprit(entry)} has a factory that does not take {', '.join(missing)} by keyword, which the model passes "
        f"to every {entry.kind} (gptzoo.hookspecs.{contract.hook}); add {them} to the factory's parameters, or choose "
        f"another {entry.kind}"
    )


def signature(entry: Entry) -> inspect.Signature | None:
    """The factory's signature; None for a callable without one (a builtin: the factory will judge)."""
    with running(entry, "has a signature that cannot be read"):
        if _module_without_init(entry.factory):
            return inspect.Signature()
        try:
            return inspect.signature(entry.factory)
        except (TypeError, ValueError):
            return None


def _module_without_init(factory: object) -> bool:
    """An nn.Module subclass that defines no ``__init__``: torch's own reads ``(*args, **kwargs)`` but
    takes nothing (it refuses any keyword), so its factory takes no parameters. Only a class whose module
    imported torch can be one, so this never imports torch itself."""
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and isinstance(factory, type)
        and issubclass(factory, torch.nn.Module)
        and factory.__init__ is torch.nn.Module.__init__
    )


def takes(entry: Entry, arg: str) -> bool:
    """Whether the factory's signature names ``arg`` (a keyword it can be given)."""
    sig = signature(entry)
    if sig is None:
        return False
    parameter = sig.parameters.get(arg)
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


def check(entry: Entry, kwargs: Mapping[str, Any]) -> list[str]:
    """The problems the factory's optional ``check(**kwargs)`` finds (none without a check), as plain
    str copies: formatting them later runs nothing of the plugin's (a str subclass may override
    ``__format__``). A check that raises, or returns anything but a list or tuple of str, is a
    PluginError."""
    with running(entry, "has a broken check"):
        method = getattr(entry.factory, "check", None)
    if method is None:
        return []
    if not callable(method):
        raise PluginError(
            f"{culprit(entry)} has a broken check: it is {show_plain(method)}, not a function; {fix(entry)}"
        )
    with running(entry, "has a broken check"):
        result = method(**kwargs)
        problems = list(result) if isinstance(result, (list, tuple)) else None
    if problems is None:
        raise PluginError(
            f"{culprit(entry)} has a broken check: it returned {show_plain(result)}, not a list of str; {fix(entry)}"
        )
    bad = [p for p in problems if not issubclass(type(p), str)]  # type(): isinstance would ask its __class__
    if bad:
        raise PluginError(
            f"{culprit(entry)} has a broken check: it returned a list holding {show_plain(bad[0])}, not only str; "
            f"{fix(entry)}"
        )
    with running(entry, "has a broken check"):
        return [str.__str__(p) for p in problems]


def check_contract(entry: Entry, built: object, *, width: int | None = None) -> None:
    """The built object has every member its kind's contract requires, of the type its interface
    declares, and is an nn.Module (a model's component) or callable (a sampler); a module's
    parameters and persistent buffers are of a dtype a checkpoint holds (or the default dtype); a norm
    or mlp built at ``width`` returns the shape of its input (:func:`shape_problem`)."""
    from torch import nn  # something was built: torch is loaded

    contract = CONTRACTS[entry.kind]
    with running(entry, "built an object that cannot be inspected"):
        missing = [member for member in contract.members if not hasattr(built, member)]
    if contract.module and not isinstance(built, nn.Module):
        missing.insert(0, "nn.Module")
    elif not contract.module and not callable(built):
        missing.insert(0, "__call__")
    what = f"{culprit(entry)} built {a(type(built).__name__)}"
    if missing:
        raise PluginError(
            f"{what} without {', '.join(missing)}, which the {entry.kind} contract requires "
            f"(gptzoo.hookspecs.CONTRACTS, interface gptzoo.interfaces.{contract.interface}); {fix(entry)}"
        )
    declared = declared_members(contract.interface)
    with running(entry, "built an object that cannot be inspected"):
        present = [m for m in contract.optional if m in declared and hasattr(built, m)]  # typed when given
    for member in (*contract.members, *present):
        positive = member in contract.positive
        with running(entry, "built an object that cannot be inspected"):
            problem = member_problem(getattr(built, member), declared[member], positive=positive)
        if problem:
            says = f"{declared[member].text}{', and at least 1 when an int' if positive else ''}"
            raise PluginError(
                f"{what}: its {member} is {problem}, the {entry.kind} contract says {says} "
                f"(gptzoo.interfaces.{contract.interface}); {fix(entry)}"
            )
    if contract.module:
        with running(entry, "built a module whose forward cannot be inspected"):
            problem = forward_problem(entry.kind, built)
        if problem:
            raise PluginError(f"{what} whose {problem}; {fix(entry)}")
        if width is not None and entry.kind in SHAPE_KEPT:
            with running(entry, "failed in its forward"):
                problem = shape_problem(built, width)
            if problem:
                raise PluginError(f"{what} whose {problem}; {fix(entry)}")
        with running(entry, "built a module whose state dict cannot be read"):
            state = built.state_dict(keep_vars=True)
            problem = state_problem(state) or transient_problem(built.named_buffers(), state) or int8_problem(built)
        if problem:
            raise PluginError(f"{what} whose {problem}; {fix(entry)}")


CALLED_WITH = {"norm": "x", "activation": "x", "mlp": "x", "attention": "x, ctx, cache"}
"""How the model calls a built module of each kind (gptzoo.model.gpt; a position is not called, only
its embed, rotary and attn_bias, which the contract holds it to)."""


SHAPE_KEPT = ("norm", "mlp")
"""The kinds whose forward returns the shape of its input (B, T, width), which the model adds to the stream."""


def shape_problem(module: nn.Module, width: int) -> str | None:
    """Why the module's forward on a (1, 2, width) input (on its own device, in its parameters' dtype:
    shapes only on the meta device) is not of that shape, or None. On the meta device a forward that
    needs values (``bincount``, ``.item()``, an op without a meta kernel) cannot run: None, and the
    shape is checked where the model is built on a real device."""
    import torch

    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    like = {"device": tensor.device, "dtype": tensor.dtype} if tensor is not None else {}
    x = (
        torch.zeros(1, 2, width, **like)
        if like.get("dtype", torch.float32).is_floating_point
        else torch.zeros(1, 2, width)
    )
    with torch.no_grad():
        try:
            y = module(x)
        except (NotImplementedError, RuntimeError) as exc:
            if x.device.type == "meta" and (isinstance(exc, NotImplementedError) or "meta" in str(exc).lower()):
                return None
            raise
    shape = tuple(y.shape) if isinstance(y, torch.Tensor) else None
    if shape == tuple(x.shape):
        return None
    returned = f"shape {shape}" if shape is not None else show_plain(y)
    return f"forward returned {returned} for an input of shape {tuple(x.shape)}; the model needs the input's shape"


def forward_problem(kind: str, module: nn.Module) -> str | None:
    """Why the model could not call the module as it does (CALLED_WITH), or None. A forward whose
    signature cannot be read (a builtin) is left to run."""
    from torch import nn  # something was built: torch is loaded

    called = CALLED_WITH.get(kind)
    if called is None:
        return None
    if type(module).forward is nn.Module.forward:
        return f"forward is not defined, and the model calls it as forward({called})"
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*(None for _ in called.split(", ")))
    except TypeError:
        hook = CONTRACTS[kind].hook
        return f"forward{signature} cannot take ({called}), which the model passes it (gptzoo.hookspecs.{hook})"
    return None


def linear_paths(module: nn.Module) -> list[str]:
    """The paths of the plain nn.Linear modules inside ``module`` (``attn.c_attn``), in order: what
    ``--dtype int8`` and ``int4`` may quantize (gptzoo.inference.quantize)."""
    from torch import nn  # something was built: torch is loaded

    return [path for path, child in module.named_modules() if type(child) is nn.Linear]


def int8_problem(module: nn.Module) -> str | None:
    """Why the module's class attribute ``int8`` (contract 4: which of its linears ``--dtype int8`` may
    quantize) is not True, False or a tuple of the paths of nn.Linear modules inside it, or None."""
    declared = getattr(type(module), "int8", True)
    if type(declared) is bool:
        return None
    linears = linear_paths(module)
    if not isinstance(declared, tuple) or not all(isinstance(name, str) for name in declared):
        return f"int8 is {show_plain(declared)}, not True, False or a tuple of the names of its nn.Linear modules"
    unknown = [name for name in declared if name not in linears]
    if unknown:
        return (
            f"int8 names {unknown[0]!r}, which is not one of its nn.Linear modules "
            f"({', '.join(linears) if linears else 'it has none'})"
        )
    return None


def state_problem(state: Mapping[str, Any]) -> str | None:
    """Why a tensor of a module's state dict (its parameters and persistent buffers) is not one a
    checkpoint holds, or None."""
    import torch  # something was built: torch is loaded
    from torch import nn

    usable = {*(getattr(torch, name) for name in WEIGHT_DTYPES), torch.get_default_dtype()}
    for key, tensor in state.items():
        if isinstance(tensor, torch.Tensor) and tensor.dtype not in usable:
            kind = "floating point" if tensor.is_floating_point() else "not floating point"
            if isinstance(tensor, nn.Parameter):
                which, remedy = "parameter", "create it in the default dtype"
            else:
                which = "persistent buffer"
                remedy = "create it in the default dtype, or compute it in forward instead of storing it"
            dtype = dtype_name(tensor.dtype)
            return (
                f"{which} {key!r} holds {dtype} values ({kind}), and a checkpoint's weights are "
                f"{WEIGHT_DTYPES_TEXT}: {remedy}"
            )
    return None


def transient_problem(buffers: Iterator[tuple[str, torch.Tensor]], state: Mapping[str, Any]) -> str | None:
    """Why a buffer outside the state dict (``persistent=False``) cannot work, or None: a checkpoint
    is loaded into a model built on the meta device, and only the state dict gets real values."""
    for key, _ in buffers:
        if key not in state:
            return (
                f"buffer {key!r} is registered with persistent=False, which no checkpoint restores (gptzoo loads "
                "weights into a model built on the meta device): compute it in forward from the constructor's "
                "arguments (as gptzoo's rope does), or make it a persistent float buffer"
            )
    return None


@dataclass(frozen=True)
class Declared:
    """What an interface says one of its members is: an instance of ``classes``, or a method (no classes)."""

    text: str
    """How the contract says it: ``nn.Linear``, ``int | None``, ``a method``."""
    classes: tuple[type, ...] = ()


@functools.cache
def declared_members(interface: str) -> dict[str, Declared]:
    """The members that the class gptzoo.interfaces.``interface`` defines as a method, or annotates
    with a class or a union of classes, and what it declares of each."""
    from gptzoo import interfaces  # it imports torch, loaded once something was built

    cls = getattr(interfaces, interface)
    declared = {name: Declared("a method") for name, value in vars(cls).items() if inspect.isfunction(value)}
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        classes = typing.get_args(hint) if union else (hint,)
        if all(isinstance(c, type) for c in classes):
            declared[name] = Declared(" | ".join(map(class_text, classes)), classes)
    return declared


def class_text(cls: type) -> str:
    """``nn.Linear``, ``int``, ``None``: a class as gptzoo.interfaces writes it."""
    if cls is type(None):
        return "None"
    if cls.__module__.startswith("torch.nn."):
        return f"nn.{cls.__qualname__}"
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def member_problem(value: object, declared: Declared, *, positive: bool) -> str | None:
    """What ``value`` is (``a Sequential``, ``-3``) when it is not what the interface declares, else
    None. A bool is no int here, as in a recipe; the int of a ``positive`` member is at least 1."""
    if not declared.classes:
        ok = callable(value)
    elif isinstance(value, bool) and bool not in declared.classes:
        ok = False
    else:
        ok = isinstance(value, declared.classes) and not (positive and isinstance(value, int) and value < 1)
    if ok:
        return None
    return show_plain(value) if type(value) in (int, float, bool, str, type(None)) else a(type(value).__name__)


def a(noun: str) -> str:
    """``a Sequential``, ``an object``."""
    return f"{'an' if noun[:1] in tuple('AEIOUaeiou') else 'a'} {noun}"


def overridden(entry: Entry) -> str:
    """`` (norm 'layernorm' is overridden by mypkg (mypkg 1.0))`` for an entry registered with
    override=True over another, else ``""``: the tail of a problem with its parameters, which would
    otherwise read as if the recipe were wrong."""
    return f" ({entry.kind} {entry.name!r} is overridden by {entry.provenance})" if entry.overrides else ""


def _loaded_class(entry: Entry) -> type | None:
    """The class ``entry`` builds when it is one that is already imported (a reference is not imported here)."""
    target = entry.target
    if isinstance(target, Reference):
        target = sys.modules.get(target.module)
        for name in entry.target.attribute.split(".") if target is not None else ():
            target = getattr(target, name, None)
    return target if isinstance(target, type) else None


def failure_of(
    exc: BaseException, registry: Registry, *, while_: str = "while the model ran", remedy: str | None = None
) -> PluginError | None:
    """``exc``, raised while a command ran a model, as the PluginError of the third-party plugin whose
    code raised it (the innermost frame of its traceback that runs a plugin's module): it names the
    component whose method raised when one did, else the plugin. None when no plugin code raised it
    (gptzoo's own components are not blamed: their failure is gptzoo's bug, and keeps its traceback).
    ``while_`` says when it failed and ``remedy`` replaces the message's usual fix."""
    entries = [e for e in registry.all_entries() if e.provenance.distribution != GPTZOO_DISTRIBUTION]
    packages = {}
    for entry in entries:
        module = entry.target.module if isinstance(entry.target, Reference) else getattr(entry.target, "__module__", "")
        for name in (entry.provenance.plugin, str(module)):
            packages.setdefault(name.partition(".")[0], entry)
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        package = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if package not in packages:
            continue
        owner = frame.f_locals.get("self")
        entry = next((e for e in entries if (cls := _loaded_class(e)) is not None and isinstance(owner, cls)), None)
        if entry is not None:
            return PluginError(f"{culprit(entry)} failed {while_}: {describe_raised(exc)}; {remedy or fix(entry)}")
        provenance = packages[package].provenance
        return PluginError(
            f"plugin {provenance} failed {while_}: {describe_raised(exc)}; "
            f"{remedy or 'fix the plugin, or choose components of another'}"
        )
    return None


def raise_as_plugin_failure(exc: Exception, registry: Registry) -> NoReturn:
    """Raise ``exc`` again: as :func:`failure_of`'s PluginError when a plugin's code raised it, else as it is."""
    failure = failure_of(exc, registry)
    if failure is None:
        raise exc
    raise failure from exc


@contextmanager
def plugin_failures(registry: Registry) -> Iterator[None]:
    """Run the block; what a plugin's code raises in it is re-raised as :func:`failure_of`'s PluginError
    (for work whose traceback would not survive, as in a worker process of a parallel sweep)."""
    try:
        yield
    except GptzooError:
        raise
    except Exception as exc:
        raise_as_plugin_failure(exc, registry)

"""Running a registered component's own code: its factory, its signature and its optional ``check``,
and holding what the factory built to its kind's contract (gptzoo.hookspecs.CONTRACTS).

Built-ins are treated like any plugin. Whatever the code raises becomes one PluginError naming the
component and its plugin (distribution and version), and the fix: ``sys.exit`` and ``os._exit`` too
(``os._exit`` raises gptzoo.plugin_manager.PluginExit meanwhile, see
:func:`gptzoo.plugin_manager.exit_guard`). KeyboardInterrupt stays an interrupt. A GptzooError keeps
its message, prefixed by the component and plugin unless gptzoo itself registered the component (its
own messages already say what to fix).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

from gptzoo.errors import GptzooError, PluginError, exception_text
from gptzoo.hookspecs import CONTRACTS
from gptzoo.plugin_manager import describe_raised, exit_guard
from gptzoo.registry import Entry, show_plain

GPTZOO_DISTRIBUTION = "gptzoo"
"""The distribution of the built-in components."""


def culprit(entry: Entry) -> str:
    """``norm 'rmsnorm' from gptzoo.builtins.norms (gptzoo 0.1.0)``: who a message is about."""
    return f"{entry.kind} {entry.name!r} from {entry.provenance}"


def fix(entry: Entry) -> str:
    return f"fix the plugin, or choose another {entry.kind}"


@contextmanager
def running(entry: Entry, what: str, *, user_errors: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Run the entry's code; what it raises (but KeyboardInterrupt and ``user_errors``, which the
    caller reports) becomes a PluginError: ``{culprit} {what}: {what it raised}; {fix}``."""
    try:
        with exit_guard():
            yield
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
    """``entry.factory(**kwargs)``; failures as :func:`running` says (``user_errors`` pass through)."""
    with running(entry, "failed to build", user_errors=user_errors):
        return entry.factory(**kwargs)


def signature(entry: Entry) -> inspect.Signature | None:
    """The factory's signature; None for a callable without one (a builtin: the factory will judge)."""
    with running(entry, "has a signature that cannot be read"):
        try:
            return inspect.signature(entry.factory)
        except (TypeError, ValueError):
            return None


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


def check_contract(entry: Entry, built: object) -> None:
    """The built object has every member its kind's contract requires, of the type its interface
    declares, and is an nn.Module (a model's component) or callable (a sampler); a module's
    parameters and persistent buffers are floating point (a checkpoint holds nothing else)."""
    contract = CONTRACTS[entry.kind]
    with running(entry, "built an object that cannot be inspected"):
        missing = [member for member in contract.members if not hasattr(built, member)]
    if contract.module and not isinstance(built, nn.Module):
        missing.insert(0, "nn.Module")
    elif not contract.module and not callable(built):
        missing.insert(0, "__call__")
    if missing:
        raise PluginError(
            f"{culprit(entry)} built a {type(built).__name__} without {', '.join(missing)}, which the {entry.kind} "
            f"contract requires (gptzoo.hookspecs.CONTRACTS, interface gptzoo.interfaces.{contract.interface}); "
            f"{fix(entry)}"
        )


def overridden(entry: Entry) -> str:
    """`` (norm 'layernorm' is overridden by mypkg (mypkg 1.0))`` for an entry registered with
    override=True over another, else ``""``: the tail of a problem with its parameters, which would
    otherwise read as if the recipe were wrong."""
    return f" ({entry.kind} {entry.name!r} is overridden by {entry.provenance})" if entry.overrides else ""

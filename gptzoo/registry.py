"""The registry: kind -> name -> entry (factory, one-line doc, provenance).

It is filled by calling each plugin's ``register_<kind>s`` hook with a ``register`` function bound
to that plugin, so every entry knows which plugin, distribution and version it came from. A plugin's
registrations are accepted all together or not at all: a plugin that registers a duplicate name
(without ``override=True``), registers something malformed (a name that is not a plain word, a
factory that is not callable, a doc that is not a str or holds a control character, an override that
is not a bool) or raises is marked failed, and the entries of the others stand. A ``register``
called after its hook returned (a plugin that kept it) raises a PluginError instead of registering
what nobody would see. A third-party plugin's hooks run under :func:`gptzoo.plugin_manager.guarded`
(os._exit is caught, a slow one is named on stderr).
"""

from __future__ import annotations

import functools
import inspect
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from gptzoo.errors import PluginError, RegistryError, UnknownComponentError
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.plugin_manager import (
    NO_PLUGINS_ENV,
    STRICT_ENV,
    GptzooPluginManager,
    PluginInfo,
    describe_failure,
    env_flag,
    get_plugin_manager,
    guarded,
    strict_failure,
)

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
"""A component name: what a recipe, a --set override and a table show without quoting."""


@dataclass(frozen=True)
class Provenance:
    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version})"


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    factory: Callable[..., Any]
    doc: str
    provenance: Provenance
    overrides: Provenance | None = None
    """The provenance of the entry this one replaced, if it was registered with override=True."""


class Registry:
    """kind -> name -> :class:`Entry`, plus the load report of every plugin consulted."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self.plugins: list[PluginInfo] = []

    def get(self, kind: str, name: str) -> Entry:
        entries = self._kind(kind)
        try:
            return entries[name]
        except KeyError:
            raise UnknownComponentError(kind, name, entries, more=f"see `gptzoo list {kind}`") from None

    def names(self, kind: str) -> list[str]:
        return sorted(self._kind(kind))

    def entries(self, kind: str | None = None) -> Iterator[Entry]:
        for k in (kind,) if kind is not None else KINDS:
            yield from (self._kind(k)[name] for name in self.names(k))

    @property
    def failed(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.status == "failed"]

    def _kind(self, kind: str) -> dict[str, Entry]:
        try:
            return self._entries[kind]
        except KeyError:
            raise UnknownComponentError("component kind", kind, KINDS) from None

    def add_plugin(self, pm: GptzooPluginManager, plugin_name: str, provenance: Provenance) -> None:
        """Call every register hook of one plugin; commit its entries only if all are valid."""
        plugin = pm.get_plugin(plugin_name)
        staged: list[tuple[Entry, bool]] = []
        for kind in KINDS:
            caller = getattr(pm.hook, f"register_{kind}s")
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    register, close = self._stager(kind, provenance, staged)
                    try:
                        impl.function(register=register)
                    finally:
                        close()
        seen: dict[tuple[str, str], Entry] = {}
        for entry, override in staged:
            key = (entry.kind, entry.name)
            if key in seen:
                raise RegistryError(f"{entry.kind} {entry.name!r} is registered twice by {entry.provenance}")
            current = self._entries[entry.kind].get(entry.name)
            if current is not None and not override:
                raise RegistryError(
                    f"{entry.kind} {entry.name!r} is registered by both {current.provenance} and "
                    f"{entry.provenance}; rename one, or register the later one with override=True"
                )
            seen[key] = replace(entry, overrides=current.provenance) if current is not None else entry
        for (kind, name), entry in seen.items():
            self._entries[kind][name] = entry

    @staticmethod
    def _stager(
        kind: str, provenance: Provenance, staged: list[tuple[Entry, bool]]
    ) -> tuple[Callable[..., None], Callable[[], None]]:
        """The ``register`` one hook call receives, and what closes it when the hook returns: a plugin
        that kept it and calls it later gets an error instead of a registration nobody would see."""
        hook_open = True

        def close() -> None:
            nonlocal hook_open
            hook_open = False

        def register(name: str, factory: Callable[..., Any], *, doc: str | None = None, override: bool = False) -> None:
            if not hook_open:
                raise PluginError(
                    f"{provenance}: register() was called after {CONTRACTS[kind].hook} returned; call it inside "
                    "the hook"
                )
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise RegistryError(
                    f"{provenance} registered an invalid {kind} name: {show_plain(name)}; a name is 1 to 64 letters, "
                    "digits, '_', '-' or '.', starting with a letter, digit or '_'"
                )
            what = f"{provenance} registered {kind} {name!r}"
            if not callable(factory):
                raise RegistryError(
                    f"{what} with a factory that is not callable: {show_plain(factory)}; pass the class or function "
                    "that builds it"
                )
            if doc is not None and not isinstance(doc, str):
                raise RegistryError(
                    f"{what} with a doc that is not a str: {show_plain(doc)}; doc is one line of text, or None for the "
                    "factory's docstring"
                )
            if not isinstance(override, bool):
                raise RegistryError(
                    f"{what} with an override that is not a bool: {show_plain(override)}; use True or False"
                )
            given = doc is not None
            if doc is None:
                documented = factory.func if isinstance(factory, functools.partial) else factory
                doc = inspect.getdoc(documented) or ""
            line = _first_line(doc)
            if reason := _not_text(line):
                raise RegistryError(
                    f"{what} with a doc holding {reason}: {show_plain(line)}; doc is one line of plain text"
                    if given
                    else f"{what} with a factory whose docstring holds {reason} in its first line: {show_plain(line)}; "
                    "write that line as plain text, or pass doc"
                )
            staged.append((Entry(kind, name, factory, line, provenance), override))

        register.__qualname__ = "register"  # what a TypeError about its arguments calls it
        return register, close


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def _not_text(line: str) -> str | None:
    """What in a line would not reach a terminal as text (a control character, such as an ANSI escape,
    or a lone surrogate, which cannot be encoded), or None."""
    for ch in line:
        category = unicodedata.category(ch)
        if category in ("Cc", "Cs"):
            return "a control character" if category == "Cc" else "a lone surrogate"
    return None


def show_plain(value: object) -> str:
    """A short, safe rendering of what a plugin passed or returned: the repr of a plain value (not of a
    subclass, whose repr is its own code), else its type."""
    if type(value) in (str, int, float, bool) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() <= 128 else "a large integer"
        return text if len(text) <= 60 else text[:57] + "..."
    return f"an object of type {type(value).__name__}"


def get_registry(*, third_party: bool | None = None, strict: bool | None = None) -> Registry:
    """A registry filled from a fresh plugin manager: built-ins first, then third-party plugins.

    Args:
        third_party: load entry points of group ``gptzoo``; default: unless $GPTZOO_NO_PLUGINS is set.
        strict: make any plugin failure fatal; default: when $GPTZOO_STRICT_PLUGINS is set.
    """
    pm = get_plugin_manager(third_party=third_party, strict=strict)
    return registry_from(pm)


@functools.cache
def _default(third_party: bool, strict: bool) -> Registry:
    return get_registry(third_party=third_party, strict=strict)


def default_registry() -> Registry:
    """The registry library functions use when none is passed: built once per process (for the
    current $GPTZOO_NO_PLUGINS / $GPTZOO_STRICT_PLUGINS settings) and shared, so a recipe is
    validated and built against the same plugins. A command builds its own with get_registry()
    and passes it on; ``default_registry.cache_clear()`` forgets the shared one."""
    return _default(not env_flag(NO_PLUGINS_ENV), env_flag(STRICT_ENV))


default_registry.cache_clear = _default.cache_clear  # type: ignore[attr-defined]


def registry_from(pm: GptzooPluginManager) -> Registry:
    """Fill a registry from an already loaded plugin manager (its reports are updated in place)."""
    registry = Registry()
    for i, info in enumerate(pm.reports):
        if info.status != "ok":
            continue
        provenance = Provenance(info.module, info.distribution, info.version)
        if info.builtin:
            registry.add_plugin(pm, info.name, provenance)  # an error here is a bug in gptzoo itself
            continue
        try:
            with guarded(info, "registering", pm.warn_s):
                registry.add_plugin(pm, info.name, provenance)
        except BaseException as exc:  # a plugin's own code may raise anything, even KeyboardInterrupt
            message = describe_failure(exc, "while registering")
            if pm.strict:
                raise PluginError(strict_failure(info, f"failed while registering: {message}")) from exc
            pm.reports[i] = replace(info, status="failed", error=message)
    registry.plugins = list(pm.reports)
    return registry

"""The registry: kind -> name -> entry (factory, one-line doc, provenance).

It is filled by calling each plugin's ``register_<kind>s`` hook with a ``register`` function bound
to that plugin, so every entry knows which plugin, distribution and version it came from. A plugin's
registrations are accepted all together or not at all: a plugin that registers one name twice itself
(without ``override=True``), registers something malformed (a name that is not a plain word, a
factory that is not callable or has a parameter without a default, a doc that is not a str or holds
a control character, an override that is not a bool) or raises is marked failed, and the entries of
the others stand; the names it registered before failing are remembered, so that using one says
which plugin failed. A subsystem's hook (decode lowerings, HF layouts, cache rows, adapter parts...) is
the exception: one that raises or is refused loses its own rows only, and the plugin's components load
without them (an eager step, no layout, one sequence at a time), the refusal kept in the plugin's
report (``PluginInfo.refused``). A ``register`` called after its hook returned (a plugin that kept it)
raises a PluginError instead of registering what nobody would see. A third-party plugin's hooks run under
:func:`gptzoo.plugin_manager.guarded` (os._exit is caught, a slow one is named on stderr).

By reference. ``register("dyt", "gptzoo_dyt.norms:DyT", doc="...")`` names the factory by where it lives
(a :class:`Reference`, as an entry point names an object) instead of passing it: the module is imported
the first time the factory is needed (:attr:`Entry.factory`: building, validating a recipe's parameters,
the conformance kit), never to list or resolve names, so a plugin that registers everything by reference
costs ``gptzoo list`` nothing of torch. The doc is then required (the listing cannot read the
docstring), and the factory is held to the rules above when it is imported: a reference that cannot be
imported (its module or attribute missing, its import raising, os._exit included) or that names no fit
factory is a PluginError at that point, naming the plugin, its distribution and the reference.

What subsystems know of classes. A plugin's hooks for the subsystems (a decode lowering, a Hugging Face
layout, adapter parts, a cache mover: each subsystem's hook spec and its gptzoo.class_table.Intake) are
called through the intakes the plugin manager collected (``pm.intakes``), under the same rules: all of a
plugin's registrations or none, and the rows land in :attr:`Registry.rows` by hook. This module knows the
components; what a subsystem makes of a class is that subsystem's.

Names. Every entry has a qualified name ``DISTRIBUTION:name`` (``gptzoo:layernorm``,
``gptzoo-extras:sliding_window``; the distribution compared as PEP 503 normalizes it), which always
reaches it. A bare name reaches the entry it resolves to:

- one entry of that name: that one;
- a third-party entry of a name a built-in has: the built-in's stays (shipped recipes keep their
  meaning); the plugin's is *shadowed*, reachable qualified (:meth:`Registry.shadowing`: a recipe that
  names it bare gets the built-in and one warning, gptzoo.recipe.validate);
- two third-party entries of one name, neither with ``override=True``: the bare name is *ambiguous*,
  an error naming both qualified names;
- ``override=True``: the bare name means the later entry; the one it *replaced* stays reachable
  qualified.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gptzoo.errors import AmbiguousComponentError, GptzooWarning, PluginError, RegistryError, UnknownComponentError
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.moves import moved
from gptzoo.plugin_manager import (
    NO_PLUGINS_ENV,
    STRICT_ENV,
    GptzooPluginManager,
    PluginInfo,
    canonical_name,
    describe_failure,
    describe_raised,
    env_flag,
    exit_guard,
    get_plugin_manager,
    guarded,
    strict_failure,
)

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
"""A component name: what a recipe, a --set override and a table show without quoting."""
GPTZOO_DISTRIBUTION = "gptzoo"
"""The distribution of the built-in components."""


@dataclass(frozen=True)
class Provenance:
    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version})"

    @property
    def origin(self) -> str:
        """``gptzoo-extras 1.2.0``: the distribution and version, as a checkpoint records them."""
        return f"{self.distribution} {self.version}"


@dataclass(frozen=True)
class Reference:
    """``"package.module:Attribute"``: a factory named by where it lives, imported when first needed."""

    module: str
    attribute: str
    """A name in the module, or a dotted path below one (``Outer.Inner``)."""

    @classmethod
    def parse(cls, text: str) -> Reference | None:
        """The reference ``text`` spells (dotted identifiers, one ``:`` between module and attribute), or None."""
        module, sep, attribute = text.partition(":")
        if not sep or not all(part.isidentifier() for part in (*module.split("."), *attribute.split("."))):
            return None
        return cls(module, attribute)

    def __str__(self) -> str:
        return f"{self.module}:{self.attribute}"

    def load(self, failed: Callable[[str], Exception]) -> Any:
        """Import the module and return the attribute, with ``os._exit`` guarded. Whatever the import
        raises (sys.exit and os._exit included; KeyboardInterrupt stays an interrupt) is raised as
        ``failed(what it raised, described)``, the caller's error naming who registered the reference."""
        try:
            with exit_guard():
                found = importlib.import_module(self.module)
                for part in self.attribute.split("."):
                    found = getattr(found, part)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a plugin's import may raise anything, sys.exit and os._exit included
            raise failed(describe_raised(exc)) from exc
        return found


def class_key(cls: type | Reference) -> str:
    """``"gptzoo_plugins._norms:RMSNorm"``: how a class is named where a subsystem keys what it knows of
    it (a decode lowering, a Hugging Face layout), whether a plugin passed the class or its reference."""
    return str(cls) if isinstance(cls, Reference) else f"{cls.__module__}:{cls.__qualname__}"


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    target: Callable[..., Any] | Reference
    """The factory as the plugin registered it: the callable itself, or a reference to it."""
    doc: str
    provenance: Provenance
    overrides: Provenance | None = None
    """The provenance of the entry this one replaced, if it was registered with override=True."""
    contract: int | None = None
    """The plugin contract version its plugin declares (gptzoo.hookspecs.CONTRACT_ATTRIBUTE), or None."""
    warned: set[str] = field(default_factory=set, compare=False, repr=False)
    """The warnings :meth:`warn` emitted about this entry."""

    def warn(self, message: str) -> None:
        """Emit ``message`` as a GptzooWarning once for this entry: the registry a command builds
        and loads with holds its entries, so a command says it once however often it validates or builds."""
        if message not in self.warned:
            self.warned.add(message)
            warnings.warn(message, GptzooWarning, stacklevel=3)

    @property
    def qualified_name(self) -> str:
        """``gptzoo-extras:sliding_window``: the name that reaches this entry whatever else is installed."""
        return f"{self.provenance.distribution}:{self.name}"

    @functools.cached_property
    def factory(self) -> Callable[..., Any]:
        """The factory. One registered by reference is imported now, the first time it is needed (with
        ``os._exit`` guarded); a reference that cannot be imported, or that names something registration
        would have refused, is a PluginError naming the plugin, its distribution and the reference."""
        if not isinstance(self.target, Reference):
            return self.target
        registered = f"{culprit(self)} is registered as {str(self.target)!r}"
        factory = self.target.load(
            lambda raised: PluginError(f"{registered}, which cannot be imported: {raised}; {fix(self)}")
        )
        if problem := factory_problem(self.kind, factory):
            raise PluginError(f"{registered}, {problem}")
        return factory


@dataclass(frozen=True)
class PluginRecipe:
    """A model recipe or sweep spec a plugin ships, registered by name through ``register_recipes``
    (gptzoo.hookspecs): ``gptzoo build NAME``, ``train``, ``sweep`` and ``gptzoo recipes`` find it."""

    name: str
    path: Path
    sweep: bool
    """A sweep spec (``gptzoo sweep NAME``), not a model recipe."""
    provenance: Provenance

    @property
    def qualified_name(self) -> str:
        """``DIST:name``, which reaches it when a shipped recipe (or another plugin's) has the bare name."""
        return f"{self.provenance.distribution}:{self.name}"


def culprit(entry: Entry) -> str:
    """``norm 'rmsnorm' from gptzoo_plugins.norms (gptzoo 0.1.0)``: who a message is about."""
    return f"{entry.kind} {entry.name!r} from {entry.provenance}"


def fix(entry: Entry) -> str:
    return f"fix the plugin, or choose another {entry.kind}"


def split_name(name: str) -> tuple[str | None, str]:
    """``"gptzoo-a:dyt"`` -> ``("gptzoo-a", "dyt")``; a bare name -> ``(None, name)``."""
    dist, sep, bare = name.partition(":")
    return (dist, bare) if sep else (None, name)


class Registry:
    """kind -> name -> :class:`Entry`, plus the load report of every plugin consulted."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        """kind -> bare name -> the entry it resolves to."""
        self._qualified: dict[str, dict[tuple[str, str], Entry]] = {kind: {} for kind in KINDS}
        """kind -> (normalized distribution, name) -> every entry, reachable or not by its bare name."""
        self._ambiguous: dict[str, dict[str, list[Entry]]] = {kind: {} for kind in KINDS}
        self._shadowed: set[tuple[str, tuple[str, str]]] = set()
        self._failed_names: dict[tuple[str, str], PluginInfo] = {}
        """(kind, name) -> the failed plugin that registered it before failing."""
        self.plugins: list[PluginInfo] = []
        self.rows: dict[str, list[Any]] = {}
        """Subsystem hook -> the rows every plugin registered through it, one per key
        (gptzoo.class_table.Row; the subsystem's ClassTable reads them)."""
        self.recipes: list[PluginRecipe] = []
        """Every plugin's registered recipes and sweep specs, in registration order (register_recipes)."""

    def get(self, kind: str, name: str) -> Entry:
        """The entry a bare or qualified name means; an UnknownComponentError or
        AmbiguousComponentError says why there is none."""
        entries = self._kind(kind)
        dist, bare = split_name(name)
        if dist is not None:
            entry = self._qualified[kind].get((canonical_name(dist), bare))
            if entry is None:
                raise self._unknown(kind, name)
            return entry
        if name in entries:
            return entries[name]
        if name in self._ambiguous[kind]:
            origins = [(e.provenance.distribution, e.provenance.version) for e in self._ambiguous[kind][name]]
            raise AmbiguousComponentError(kind, name, origins)
        raise self._unknown(kind, name)

    def holds(self, entry: Entry) -> bool:
        """Whether ``entry`` is one of this registry's own (not an equal one of another registry)."""
        return self._qualified.get(entry.kind, {}).get(_key(entry)) is entry

    def names(self, kind: str) -> list[str]:
        """The bare names that resolve, sorted."""
        return sorted(self._kind(kind))

    def entries(self, kind: str | None = None) -> Iterator[Entry]:
        """The entries bare names resolve to, by kind and name (one per name)."""
        for k in (kind,) if kind is not None else KINDS:
            yield from (self._kind(k)[name] for name in self.names(k))

    def all_entries(self, kind: str | None = None) -> Iterator[Entry]:
        """Every entry, reachable by its bare name or only qualified (shadowed, ambiguous, replaced),
        by kind and name, entries of one name in the order they were registered (built-ins first)."""
        for k in (kind,) if kind is not None else KINDS:
            self._kind(k)
            yield from sorted(self._qualified[k].values(), key=lambda e: e.name)  # stable: in registration order

    def shadowing(self, entry: Entry) -> list[Entry]:
        """The third-party entries whose bare name ``entry``, a built-in, keeps (shadowed), in
        registration order."""
        if entry.provenance.distribution != GPTZOO_DISTRIBUTION:
            return []
        kind = entry.kind
        return [e for e in self._qualified[kind].values() if e.name == entry.name and (kind, _key(e)) in self._shadowed]

    def available(self, kind: str) -> list[str]:
        """What a name of this kind may be: the bare names that resolve, and the qualified names of
        entries no bare name reaches."""
        return [*self.names(kind), *(e.qualified_name for e in self.all_entries(kind) if self.note(e) is not None)]

    def note(self, entry: Entry) -> str | None:
        """How an entry's bare name fails to reach it (shadowed, ambiguous, replaced), with the name
        that does; None when its bare name reaches it."""
        kind, name = entry.kind, entry.name
        current = self._entries[kind].get(name)
        if current is entry:
            return None
        write = f"write {entry.qualified_name!r}"
        rivals = self._ambiguous[kind].get(name, [])
        if any(e is entry for e in rivals):
            others = [e.provenance.origin for e in rivals if e is not entry]
            return f"ambiguous: {', '.join(others)} also register{'s' if len(others) == 1 else ''} it; {write}"
        assert current is not None  # an entry that is neither reachable nor ambiguous lost its name to another
        if (kind, _key(entry)) in self._shadowed:
            return (
                f"shadowed: {name!r} means the {kind} of {current.provenance.origin}; {write} (or register it with "
                "override=True)"
            )
        return f"replaced by {current.provenance} (override=True); {write}"

    @property
    def failed(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.status == "failed"]

    def failed_distribution(self, distribution: str) -> PluginInfo | None:
        """The first failed plugin of that distribution, or None."""
        key = canonical_name(distribution)
        return next((p for p in self.failed if canonical_name(p.distribution) == key), None)

    def loaded_distribution(self, distribution: str) -> PluginInfo | None:
        """The first plugin of that distribution that loaded, or None."""
        key = canonical_name(distribution)
        return next((p for p in self.plugins if p.status == "ok" and canonical_name(p.distribution) == key), None)

    def _kind(self, kind: str) -> dict[str, Entry]:
        try:
            return self._entries[kind]
        except KeyError:
            raise UnknownComponentError("component kind", kind, KINDS) from None

    def _unknown(self, kind: str, name: str) -> UnknownComponentError:
        """Why no entry has this name: the failed plugin that would register it when gptzoo can know
        it, else what is available and which plugins failed to load."""
        dist, bare = split_name(name)
        info = self._failed_names.get((kind, bare))
        if info is not None and dist is not None and canonical_name(dist) != canonical_name(info.distribution):
            info = None
        if info is None and dist is not None:
            info = self.failed_distribution(dist)
        available = self.available(kind) if dist is None else [e.qualified_name for e in self.all_entries(kind)]
        if info is not None:
            return UnknownComponentError(kind, name, available, reason=failed_reason(kind, name, info))
        note = ""
        if self.failed:
            listed = ", ".join(f"{p.distribution} {p.version}" for p in self.failed)
            note = f"; plugins that failed to load, which may register it: {listed} (see `gptzoo plugins`)"
        return UnknownComponentError(kind, name, available, more=f"see `gptzoo list {kind}`", note=note)

    def add_plugin(
        self,
        pm: GptzooPluginManager,
        plugin_name: str,
        provenance: Provenance,
        *,
        builtin: bool = False,
        attempted: list[tuple[str, str]] | None = None,
        contract: int | None = None,
    ) -> list[str]:
        """Call every register hook of one plugin; commit its components and recipes only if all are valid.
        A subsystem's hook (a decode lowering, an HF layout, cache rows...) that raises or registers what
        its table refuses loses that hook's rows only: the plugin's components work without it (an eager
        step, no layout, one sequence at a time), and the messages are returned (a built-in's raise).
        ``attempted`` receives the (kind, name) of each registration with a valid name, even when the
        plugin then fails; ``contract``: the contract version the plugin declares."""
        plugin = pm.get_plugin(plugin_name)
        staged: list[tuple[Entry, bool]] = []
        for kind in KINDS:
            call_hook(
                getattr(pm.hook, f"register_{kind}s"),
                plugin,
                lambda kind=kind: self._stager(kind, provenance, staged, attempted, contract),
            )
        rows, refused = {}, []
        for intake in pm.intakes:
            try:
                staged_rows = intake.stage(getattr(pm.hook, intake.hook), plugin, provenance, contract)
                rows[intake.hook] = intake.placed(self.rows.get(intake.hook, []), staged_rows)
            except Exception as exc:  # a plugin's own code may raise anything; KeyboardInterrupt goes up
                if builtin:
                    raise
                refused.append(f"its {intake.hook} was refused ({describe_raised(exc)})")
        recipes: list[PluginRecipe] = []
        call_hook(pm.hook.register_recipes, plugin, lambda: _recipe_stager(provenance, recipes))
        self._check_recipes(recipes)
        seen: set[tuple[str, str]] = set()
        for entry, override in staged:
            key = (entry.kind, entry.name)
            if key in seen:
                raise RegistryError(f"{entry.kind} {entry.name!r} is registered twice by {entry.provenance}")
            seen.add(key)
            current = self._qualified[entry.kind].get(_key(entry))
            if current is not None and not override:  # another plugin of the same distribution
                raise RegistryError(
                    f"{entry.kind} {entry.name!r} is registered by both {current.provenance} and "
                    f"{entry.provenance}; rename one, or register the later one with override=True"
                )
            if builtin and entry.name in self._entries[entry.kind] and not override:
                raise RegistryError(f"{entry.kind} {entry.name!r} is registered by two built-in plugins")
        for entry, override in staged:
            self._place(entry, override)
        self.rows.update(rows)
        self.recipes += recipes
        return refused

    def _check_recipes(self, recipes: list[PluginRecipe]) -> None:
        """One plugin's recipes: each name once per kind (recipe, sweep) within the plugin's distribution."""
        seen = {(canonical_name(r.provenance.distribution), r.name, r.sweep) for r in self.recipes}
        for recipe in recipes:
            key = (canonical_name(recipe.provenance.distribution), recipe.name, recipe.sweep)
            if key in seen:
                what = "sweep spec" if recipe.sweep else "recipe"
                raise RegistryError(f"{recipe.provenance} registers the {what} {recipe.name!r} twice; rename one")
            seen.add(key)

    def recipe(self, name: str, *, sweep: bool = False) -> PluginRecipe | None:
        """The plugin recipe (or sweep spec) a bare or ``DIST:name`` name means; None when no plugin
        registers it, or when two plugins register the bare name (then only qualified names reach them)."""
        dist, bare = split_name(name)
        found = [
            r
            for r in self.recipes
            if r.sweep == sweep
            and r.name == bare
            and (dist is None or canonical_name(r.provenance.distribution) == canonical_name(dist))
        ]
        return found[0] if len(found) == 1 else None

    def _place(self, entry: Entry, override: bool) -> None:
        """Give a committed entry its qualified name, and its bare name as the module docstring says."""
        kind, name = entry.kind, entry.name
        bare, ambiguous = self._entries[kind], self._ambiguous[kind]
        current = bare.get(name)
        if override:
            if current is not None:
                entry = replace(entry, overrides=current.provenance)
            ambiguous.pop(name, None)
            bare[name] = entry
        elif name in ambiguous:
            ambiguous[name].append(entry)
        elif current is None:
            bare[name] = entry
        elif (GPTZOO_DISTRIBUTION, name) in self._qualified[kind]:
            self._shadowed.add((kind, _key(entry)))
        else:
            del bare[name]
            ambiguous[name] = [current, entry]
        self._qualified[kind][_key(entry)] = entry

    @staticmethod
    def _stager(
        kind: str,
        provenance: Provenance,
        staged: list[tuple[Entry, bool]],
        attempted: list[tuple[str, str]] | None,
        contract: int | None,
    ) -> tuple[Callable[..., None], Callable[[], None]]:
        """The ``register`` one hook call receives, and what closes it when the hook returns."""
        call = HookCall(provenance, CONTRACTS[kind].hook)

        def register(
            name: str, factory: Callable[..., Any] | str, *, doc: str | None = None, override: bool = False
        ) -> None:
            call.check()
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise RegistryError(
                    f"{provenance} registered an invalid {kind} name: {show_plain(name)}; a name is 1 to 64 letters, "
                    "digits, '_', '-' or '.', starting with a letter, digit or '_'"
                )
            if attempted is not None:
                attempted.append((kind, name))
            what = f"{provenance} registered {kind} {name!r}"
            target: Callable[..., Any] | Reference | None = None
            if isinstance(factory, str):
                target = Reference.parse(str.__str__(factory))
                if target is None:
                    raise RegistryError(
                        f"{what} with a reference that is not 'module:attribute': {show_plain(str.__str__(factory))}; "
                        "name the factory as an entry point does, e.g. 'gptzoo_dyt.norms:DyT'"
                    )
            elif not callable(factory):
                raise RegistryError(f"{what} with {factory_problem(kind, factory)}")
            if doc is not None and not isinstance(doc, str):
                raise RegistryError(
                    f"{what} with a doc that is not a str: {show_plain(doc)}; doc is one line of text, or None for the "
                    "factory's docstring"
                )
            if not isinstance(override, bool):
                raise RegistryError(
                    f"{what} with an override that is not a bool: {show_plain(override)}; use True or False"
                )
            if target is None:
                if problem := factory_problem(kind, factory):
                    raise RegistryError(f"{what} with {problem}")
                target = factory
            elif doc is None:
                raise RegistryError(
                    f"{what} by reference {str(target)!r} without a doc; pass doc, the line listings show without "
                    "importing the factory"
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
            staged.append((Entry(kind, name, target, line, provenance, contract=contract), override))

        register.__qualname__ = "register"  # what a TypeError about its arguments calls it
        return register, call.close


class HookCall:
    """One call of a plugin's register hook, as the ``register`` it receives sees it: open until the
    hook returns, so that a plugin that kept ``register`` and calls it later gets an error instead of
    a registration nobody would see."""

    def __init__(self, provenance: Provenance, hook: str) -> None:
        self.provenance, self.hook, self.open = provenance, hook, True

    def close(self) -> None:
        self.open = False

    def check(self) -> None:
        """Refuse a registration after the hook returned."""
        if not self.open:
            raise PluginError(
                f"{self.provenance}: register() was called after {self.hook} returned; call it inside the hook"
            )


def call_hook(
    caller: Any, plugin: object, stager: Callable[[], tuple[Callable[..., None], Callable[[], None]]]
) -> None:
    """Call one plugin's implementation of a register hook with the ``register`` ``stager`` makes, closed
    when the hook returns."""
    for impl in caller.get_hookimpls():
        if impl.plugin is plugin:
            register, close = stager()
            try:
                impl.function(register=register)
            finally:
                close()


def _recipe_stager(
    provenance: Provenance, staged: list[PluginRecipe]
) -> tuple[Callable[..., None], Callable[[], None]]:
    """The ``register`` of one ``register_recipes`` call, and what closes it when the hook returns."""
    call = HookCall(provenance, "register_recipes")

    def register(name: str, path: str | os.PathLike[str], *, sweep: bool = False) -> None:
        call.check()
        what = f"{provenance} registered a {'sweep spec' if sweep is True else 'recipe'}"
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RegistryError(f"{what} whose name is not a name: {show_plain(name)}; e.g. 'tiny-moe'")
        if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
            shown = repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else show_plain(path)
            raise RegistryError(
                f"{what} {name!r} at {shown}, which is not a file; pass the path of its TOML file "
                "(e.g. Path(__file__).parent / 'recipes' / 'NAME.toml', shipped as package data)"
            )
        if not isinstance(sweep, bool):
            raise RegistryError(f"{what} {name!r} with a sweep that is not a bool: {show_plain(sweep)}")
        staged.append(PluginRecipe(name, Path(path).resolve(), sweep, provenance))

    register.__qualname__ = "register"
    return register, call.close


def _key(entry: Entry) -> tuple[str, str]:
    return canonical_name(entry.provenance.distribution), entry.name


def factory_problem(kind: str, factory: object) -> str | None:
    """What registration refuses in a factory (``a factory that is not callable: ...; pass ...``), or None."""
    if not callable(factory):
        return f"a factory that is not callable: {show_plain(factory)}; pass the class or function that builds it"
    if required := _without_default(kind, factory):
        passes = f"only {', '.join(_structural(kind))}" if _structural(kind) else "nothing"
        whose = (
            f"parameter {required[0]!r} has"
            if len(required) == 1
            else (f"parameters {', '.join(map(repr, required))} have")
        )
        return (
            f"a factory whose {whose} no default; give every parameter a default (a recipe may leave any out, and "
            f"the model passes {passes})"
        )
    return None


def _structural(kind: str) -> list[str]:
    """The arguments the model passes to a factory of this kind, in the contract's order."""
    contract = CONTRACTS[kind]
    return [arg for arg, _ in contract.structural] + list(contract.components)


def _without_default(kind: str, factory: Callable[..., Any]) -> list[str]:
    """The factory's parameters that neither have a default nor are passed by the model. A signature
    that cannot be read is judged when the component is used (gptzoo.plugin_code.signature)."""
    try:
        signature = inspect.signature(factory)
    except Exception:
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    given = CONTRACTS[kind].given_by_model
    return [
        str.__str__(p.name)
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in variadic and p.name not in given
    ]


def failed_reason(kind: str, name: str, info: PluginInfo) -> str:
    """``norm 'dyt' would come from gptzoo-dyt 1.0, which failed to load: ...``"""
    return (
        f"{kind} {name!r} would come from {info.distribution} {info.version}, which failed to load: {info.error}; "
        f"fix or uninstall it (see `gptzoo plugins`)"
    )


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
            # an error here is a bug in gptzoo itself
            registry.add_plugin(pm, info.name, provenance, builtin=True, contract=info.contract)
            continue
        attempted: list[tuple[str, str]] = []
        try:
            with guarded(info, "registering", pm.warn_s):
                refused = registry.add_plugin(pm, info.name, provenance, attempted=attempted, contract=info.contract)
        except BaseException as exc:  # a plugin's own code may raise anything, even KeyboardInterrupt
            message = describe_failure(exc, "while registering")
            if pm.strict:
                raise PluginError(strict_failure(info, f"failed while registering: {message}")) from exc
            pm.reports[i] = replace(info, status="failed", error=message)
            for key in attempted:
                registry._failed_names.setdefault(key, pm.reports[i])
            continue
        if refused:
            if pm.strict:
                raise PluginError(strict_failure(info, "loaded, but " + "; ".join(refused)))
            pm.reports[i] = replace(info, refused=tuple(refused))
    registry.plugins = list(pm.reports)
    return registry


def __getattr__(name: str) -> Any:
    """A name that moved to its subsystem (gptzoo.moves.MOVES), with one GptzooWarning per import."""
    return moved(__name__, name)

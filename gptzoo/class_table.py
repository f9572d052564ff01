"""One kind of table for what a subsystem knows of a component class, and the one intake that fills it.

A subsystem that knows something of component classes declares an :class:`Intake` beside the hook
spec through which plugins tell it more: gptzoo.inference.hooks (decode lowerings, rotary tables,
cache movers, quantizable linears), gptzoo.hf.hooks (Hugging Face layouts), gptzoo.adapters.hooks
(adapter parts). The plugin manager adds those hook specs as it adds the component kinds'
(:data:`gptzoo.plugin_manager.SUBSYSTEMS`, as pytest's ``pytest_addhooks`` adds a plugin's), and the
registry calls every plugin's implementation through its intake, all of a plugin's registrations
accepted together or none (gptzoo.registry). Each subsystem writes its built-in rows itself and
builds its :class:`ClassTable` from them and the registry's rows.

Rows. A :class:`Row` says one thing of one class: its key is the class's ``"module:Qualname"``
(:func:`gptzoo.registry.class_key`), whether the plugin passed the class or that reference, with a
*facet* where a class has several (a Hugging Face layout's name, an adapter split's attribute; else
""). Every intake's ``register(component, ..., override=False)`` takes the class, or its reference,
first; the rest is the subsystem's (its ``accept``).

Lookup, one rule (:meth:`ClassTable.find`): a class's row is its own, else its nearest base class's in
MRO order (an ``exact`` table, the cache movers', reads the class's own only: a subclass may keep its
state elsewhere). A row that ``depends`` on methods (a lowering describes ``forward``) is not used for a
subclass that overrides one of them below the row's class (:meth:`Match.changed`).

Conflicts, one rule. Within a plugin, one row per key. A row for a key another plugin's row has
replaces it with ``override=True`` (the row keeps whose it replaced); without, the later plugin
fails, with an error naming both (gptzoo.registry). A plugin's row for a key a built-in row has
replaces it with ``override=True``; without, the built-in row stays and the table keeps the conflict
(:attr:`ClassTable.conflicts`), which the subsystem reports: a lowering is refused naming both, a
layout is warned about. Before contract 7 adapter parts and cache movers took no ``override`` and
replaced what was there: a plugin written for those contracts still does
(:attr:`Intake.replaced_before`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gptzoo.errors import RegistryError
from gptzoo.registry import HookCall, Provenance, Reference, call_hook, class_key, show_plain

Accepted = list[tuple[str, Any, tuple[str, ...]]]
"""What an intake makes of one ``register`` call: (facet, value, depends) for each row it adds."""


@dataclass(frozen=True)
class Row:
    """One thing a subsystem knows of one component class, and who said it."""

    key: str
    """The class, ``"module:Qualname"``."""
    facet: str
    """Which of the class's rows ("llama" of its layouts, "c_attn" of its adapter splits); "" if it has one."""
    value: Any
    """What the subsystem knows: a lowering, a layout, a split, a mover (or a Reference to a function)."""
    provenance: Provenance
    depends: tuple[str, ...] = ()
    """Methods the value describes: a subclass that overrides one below the row's class does not use it."""
    override: bool = False
    overrides: Provenance | None = None
    """Whose row this one replaced (override=True)."""

    @property
    def where(self) -> tuple[str, str]:
        return self.key, self.facet


@dataclass(frozen=True)
class Intake:
    """How one subsystem hook's registrations become rows."""

    hook: str
    """The hook spec's name, ``register_decode_lowerings``."""
    noun: str
    """What one registration is, for messages: ``a lowering``."""
    accept: Callable[..., Accepted]
    """``accept(provenance, key, *args, **kwargs)``: the rows one ``register(component, *args, **kwargs)`` adds
    (the arguments after the class); raises a RegistryError naming what is wrong."""
    describe: Callable[[str, str], str]
    """``describe(key, facet)``: one row, for messages (``lowering of m:C``)."""
    exact: bool = False
    """Rows reach their own class only, not its subclasses."""
    depends: tuple[str, ...] = ()
    """Methods every row of this table describes (a lowering: ``forward``), beside the row's own."""
    replaced_before: int | None = None
    """A plugin declaring an older contract than this (or none) replaces rows without ``override``."""

    def stage(self, caller: Any, plugin: object, provenance: Provenance, contract: int | None) -> list[Row]:
        """Call ``plugin``'s implementation of the hook with a ``register``; the rows it registered."""
        staged: list[Row] = []
        legacy = self.replaced_before is not None and (contract is None or contract < self.replaced_before)

        def stager() -> tuple[Callable[..., None], Callable[[], None]]:
            call = HookCall(provenance, self.hook)

            def register(component: type | str, /, *args: Any, override: bool = False, **kwargs: Any) -> None:
                call.check()
                target = component if isinstance(component, type) else None
                if isinstance(component, str):
                    target = Reference.parse(str.__str__(component))
                if target is None:
                    raise RegistryError(
                        f"{provenance} registered {self.noun} for {show_plain(component)}, which is neither a class "
                        "nor a reference 'module:Class'; pass the component's class"
                    )
                key = class_key(target)
                if not isinstance(override, bool):
                    raise RegistryError(
                        f"{provenance} registered {self.noun} for {key} with an override that is not a bool: "
                        f"{show_plain(override)}; use True or False"
                    )
                try:
                    inspect.signature(self.accept).bind(provenance, key, *args, **kwargs)
                except TypeError as exc:
                    raise TypeError(f"register() {exc}") from None
                for facet, value, depends in self.accept(provenance, key, *args, **kwargs):
                    staged.append(Row(key, facet, value, provenance, depends, override or legacy))

            register.__qualname__ = "register"  # what a TypeError about its arguments calls it
            return register, call.close

        call_hook(caller, plugin, stager)
        return staged

    def placed(self, current: Sequence[Row], staged: Iterable[Row]) -> list[Row]:
        """The plugins' rows once a plugin's ``staged`` ones join ``current``: one per key within a plugin,
        and a key another plugin has only with override (a RegistryError naming both otherwise)."""
        rows = {row.where: row for row in current}
        seen: set[tuple[str, str]] = set()
        for row in staged:
            if row.where in seen:
                raise RegistryError(f"{row.provenance} registers the {self.describe(*row.where)} twice")
            seen.add(row.where)
            other = rows.get(row.where)
            if other is not None and not row.override:
                raise RegistryError(
                    f"the {self.describe(*row.where)} is registered by both {other.provenance} and {row.provenance}; "
                    "register the later one with override=True"
                )
            rows[row.where] = replace(row, overrides=other.provenance) if other is not None else row
        return list(rows.values())


@dataclass(frozen=True)
class Match:
    """The row a class found: the class in its MRO that has it, and the row."""

    owner: type
    row: Row
    conflict: Row | None = None
    """A plugin's row for the same key that did not replace the built-in one (no override=True)."""
    depends: tuple[str, ...] = ()

    def changed(self, cls: type) -> tuple[type, str] | None:
        """A class between ``cls`` and the row's class that overrides a method the row describes, and the
        method; None when none does."""
        names = (*self.depends, *self.row.depends)
        for c in cls.__mro__[: cls.__mro__.index(self.owner)]:
            for name in names:
                if name in vars(c):
                    return c, name
        return None


@dataclass
class ClassTable:
    """One subsystem's rows: its built-in ones, then the plugins' (by the rule of the module docstring)."""

    intake: Intake
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    conflicts: dict[tuple[str, str], Row] = field(default_factory=dict)
    """A plugin's row for a key a built-in row holds, registered without override=True."""

    @classmethod
    def of(cls, intake: Intake, builtins: Iterable[Row], registry: Any = None) -> ClassTable:
        """The table of ``builtins`` and the rows the registry's plugins registered through ``intake.hook``."""
        table = cls(intake, {row.where: row for row in builtins})
        for row in registry.rows.get(intake.hook, ()) if registry is not None else ():
            current = table.rows.get(row.where)
            if current is not None and not row.override:
                table.conflicts[row.where] = row
                continue
            table.rows[row.where] = replace(row, overrides=current.provenance) if current is not None else row
        return table

    def find(self, cls: type, facet: str = "", *, legacy: Callable[[type], Row | None] | None = None) -> Match | None:
        """The row of ``cls`` for ``facet``: its own, else its nearest base class's (``exact``: its own only).
        ``legacy(owner)``: a row the class gives itself, by an earlier contract's method, tried at each class."""
        for owner in (cls,) if self.intake.exact else cls.__mro__:
            where = (class_key(owner), facet)
            row = self.rows.get(where)
            if row is None and legacy is not None:
                row = legacy(owner)
            if row is not None:
                return Match(owner, row, self.conflicts.get(where), self.intake.depends)
        return None

    def get(self, key: str, facet: str = "") -> Row | None:
        return self.rows.get((key, facet))

    def value(self, row: Row, what: str, error: Callable[[str], Exception]) -> Any:
        """The row's value; a function a plugin registered by reference ``"module:function"`` is imported now
        (and kept), ``error(message)`` raised, naming the plugin and the reference, when it cannot be or is
        not callable."""
        if not isinstance(row.value, Reference):
            return row.value
        named = f"the {what} of {row.key} registered by {row.provenance} as {str(row.value)!r}"
        value = row.value.load(lambda raised: error(f"{named} cannot be imported: {raised}; fix the plugin"))
        if not callable(value):
            raise error(f"{named} is not callable; fix the plugin")
        self.rows[row.where] = replace(row, value=value)
        return value

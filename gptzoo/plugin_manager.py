"""The plugin manager: built-in plugins by module name, third-party plugins from entry points.

Third-party plugins are distributions that declare an entry point in the group ``gptzoo``::

    [project.entry-points.gptzoo]
    sqrelu = "gptzoo_sqrelu"

They are loaded one at a time: a plugin that fails to import (whatever it raises, KeyboardInterrupt
and SystemExit included), implements a misspelled hook, has a bad hook signature or a hook that
calling would not run (a wrapper, an ``async def``, a generator) is reported as failed (name,
distribution, error) and the others keep working; so is a distribution whose ``entry_points.txt``
declares the group but cannot be parsed. A plugin that loads but implements no hook (its functions
lack ``@gptzoo.hookimpl``) registers nothing and is reported with a warning (:data:`NO_HOOK`).
A plugin module may declare the contract version it is written for (``gptzoo_contract = 4``,
gptzoo.hookspecs.CONTRACT_VERSION); one that declares a newer version than this gptzoo's, or
something that is no version, fails to load as well (:func:`declared_contract`).
``GPTZOO_NO_PLUGINS=1`` skips third-party plugins, ``GPTZOO_ONLY_PLUGINS=dist-a,dist-b`` loads only
those distributions' (gptzoo's own test suite sets it to what it installs, so that it does not depend on
what else is installed);
``GPTZOO_STRICT_PLUGINS=1`` (or strict=True) makes any failure fatal. Nothing is loaded at import
time: each call builds a fresh manager.

While a third-party plugin's code runs (its import, its registration, its register hooks: see
:func:`guarded`), ``os._exit`` raises :class:`PluginExit` instead of ending the process, so the
plugin is reported failed; the real ``os._exit`` is put back afterwards (gptzoo.plugin_code does the
same, with :func:`exit_guard`, while any component's factory or check runs). A plugin that takes longer
than ``$GPTZOO_PLUGIN_WARN_S`` seconds (default 5; 0: never) gets one line on stderr naming it and
how to skip it. There is no hard timeout: Python cannot abort an import from outside, so the line is
all that happens and the plugin goes on; Ctrl-C then interrupts its import, which fails that plugin
(fatal in strict mode) while the command goes on. This guards against accidents, not malice: a
plugin runs in the gptzoo process with all its rights.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any, Literal, NoReturn

import pluggy

from gptzoo import hookspecs
from gptzoo.errors import PluginError, describe_exception, safe_repr

ENTRY_POINT_GROUP = "gptzoo"
NO_PLUGINS_ENV = "GPTZOO_NO_PLUGINS"
ONLY_PLUGINS_ENV = "GPTZOO_ONLY_PLUGINS"
STRICT_ENV = "GPTZOO_STRICT_PLUGINS"
WARN_ENV = "GPTZOO_PLUGIN_WARN_S"
DEFAULT_WARN_S = 5.0
DEFAULT_PLUGINS = (
    "gptzoo_plugins.norms",
    "gptzoo_plugins.activations",
    "gptzoo_plugins.mlps",
    "gptzoo_plugins.moe",
    "gptzoo_plugins.positions",
    "gptzoo_plugins.attentions",
    "gptzoo_plugins.mla",
    "gptzoo_plugins.short_conv",
    "gptzoo_plugins.gated_deltanet",
    "gptzoo_plugins.mamba2",
    "gptzoo_plugins.kda",
    "gptzoo_plugins.samplers",
)
"""The built-in plugins, registered first and in this order (as pytest's ``default_plugins``)."""
SUBSYSTEMS = ("gptzoo.inference.hooks", "gptzoo.hf.hooks", "gptzoo.adapters.hooks")
"""The modules of the subsystems that know something of component classes: each holds its hook specs and
their intakes (``INTAKES``, gptzoo.class_table.Intake), added as the component kinds' are."""


@dataclass(frozen=True)
class PluginInfo:
    """What happened to one plugin: where it came from and whether it loaded."""

    name: str
    module: str
    distribution: str
    version: str
    builtin: bool
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None
    warning: str | None = None
    """What is wrong with a plugin that loaded, e.g. that it implements no hook (it registers nothing)."""
    refused: tuple[str, ...] = ()
    """The subsystem registrations refused while its components loaded (``its register_cache_rows was
    refused (...)``): what works without them, e.g. one sequence at a time instead of a shared batch."""
    contract: int | None = None
    """The plugin contract version it declares it was written for (gptzoo.hookspecs.CONTRACT_ATTRIBUTE);
    None when it declares none. The built-ins are written for this gptzoo's."""


class GptzooPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers each plugin's load report."""

    def __init__(self, *, strict: bool, warn_s: float = DEFAULT_WARN_S) -> None:
        super().__init__(hookspecs.PROJECT)
        self.strict = strict
        self.warn_s = warn_s
        self.reports: list[PluginInfo] = []
        self.add_hookspecs(hookspecs)
        self.intakes: list[Any] = []
        """Every subsystem's intakes (gptzoo.class_table.Intake), through which the registry reads its hooks."""
        for name in SUBSYSTEMS:
            module = importlib.import_module(name)
            self.add_hookspecs(module)
            self.intakes += module.INTAKES


class PluginExit(BaseException):
    """Raised in place of ``os._exit(code)`` while a third-party plugin's code runs."""

    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


NO_HOOK = "implements no gptzoo hook: did you forget @gptzoo.hookimpl?"
"""The warning of a plugin that loaded and registers nothing, since pluggy saw none of its functions."""


def canonical_name(distribution: str) -> str:
    """A distribution's name as PEP 503 compares it: lower case, each run of ``-_.`` one ``-``."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def warn_seconds() -> float:
    """$GPTZOO_PLUGIN_WARN_S: seconds a plugin may take before a line on stderr names it (0, or more than a
    timer can wait, ~292 years: never)."""
    raw = os.environ.get(WARN_ENV, "").strip()
    if not raw:
        return DEFAULT_WARN_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise PluginError(f"{WARN_ENV}={raw!r} is not a number of seconds; set it to e.g. 5, or 0 for no warning")
    return 0.0 if value > threading.TIMEOUT_MAX else value  # longer than a timer can wait: never


def gptzoo_version() -> str:
    try:
        return metadata.version("gptzoo")
    except metadata.PackageNotFoundError:
        return "unknown"


def strict_failure(info: PluginInfo, what: str) -> str:
    """The message of a plugin failure made fatal by strict mode."""
    return (
        f"plugin {info.name!r} ({info.distribution} {info.version}) {what}; fix or uninstall it, "
        f"or leave strict mode (strict=True or {STRICT_ENV}) to skip it"
    )


def describe_raised(exc: BaseException) -> str:
    """One line for what a plugin's code raised: ``called os._exit(3)``, ``called sys.exit(4)``, or
    the exception (see gptzoo.errors.describe_exception: this never raises either)."""
    if isinstance(exc, PluginExit):
        return f"called os._exit({safe_repr(exc.code)})"
    if isinstance(exc, SystemExit):
        return f"called sys.exit({safe_repr(exc.code)})"
    return " ".join(describe_exception(exc).split())


def describe_failure(exc: BaseException, doing: str) -> str:
    """One line for what a plugin's code raised while ``doing`` ("at import", "while registering")."""
    text = describe_raised(exc)
    return f"{text} {doing}" if isinstance(exc, (PluginExit, SystemExit)) else text


_real_exit = os._exit
_guards = 0
"""How many :func:`guarded` blocks are running; outside them a kept reference to the stand-in exits for real."""


def _exit_stand_in(code: int) -> NoReturn:
    if _guards:
        raise PluginExit(code)
    _real_exit(code)


def load_factor() -> float:
    """How many times slower than on an idle machine code may run now: the 1-minute load average per
    core, at least 1 (1 where the platform has no load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def _warn_slow(info: PluginInfo, doing: str, seconds: float, factor: float) -> None:
    waited = f"{seconds * factor:.3g} s" if factor > 1 else f"{seconds:g} s"
    loaded = f" ({WARN_ENV}={seconds:g}, stretched for a load of {factor:.2g} processes per core)" if factor > 1 else ""
    line = (
        f"warning: plugin {info.name!r} (module {info.module}, distribution {info.distribution} {info.version}) "
        f"is still {doing} after {waited}{loaded}; it may only be slow ({WARN_ENV} sets how long to wait, 0 never "
        f"warns); {NO_PLUGINS_ENV}=1 or uninstalling {info.distribution} skips it"
    )
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed or replaced by something broken: nothing to tell
        pass


@contextmanager
def exit_guard() -> Iterator[None]:
    """Run a plugin's code with ``os._exit`` raising :class:`PluginExit` instead of ending the process;
    the real one is put back afterwards (blocks may nest)."""
    global _guards
    saved = os._exit
    os._exit = _exit_stand_in
    _guards += 1
    try:
        yield
    finally:
        _guards -= 1
        os._exit = saved


@contextmanager
def guarded(info: PluginInfo, doing: str, warn_s: float) -> Iterator[None]:
    """Run a third-party plugin's import or registration under :func:`exit_guard`, and if it takes
    longer than ``warn_s`` seconds (0: never), stretched by the machine's :func:`load_factor` (a plugin
    is not blamed for a busy machine), one line on stderr names the plugin and how to skip it."""
    factor = load_factor() if warn_s > 0 else 1.0
    wait = min(warn_s * factor, threading.TIMEOUT_MAX)
    timer = threading.Timer(wait, _warn_slow, (info, doing, warn_s, factor)) if warn_s > 0 else None
    with exit_guard():
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            yield
        finally:
            if timer is not None:
                timer.cancel()


def get_plugin_manager(*, third_party: bool | None = None, strict: bool | None = None) -> GptzooPluginManager:
    """A fresh plugin manager with the built-in plugins and (unless disabled) third-party ones."""
    if third_party is None:
        third_party = not env_flag(NO_PLUGINS_ENV)
    if strict is None:
        strict = env_flag(STRICT_ENV)
    pm = GptzooPluginManager(strict=strict, warn_s=warn_seconds() if third_party else DEFAULT_WARN_S)
    version = gptzoo_version()
    for module_name in DEFAULT_PLUGINS:
        module = importlib.import_module(module_name)
        pm.register(module, name=module_name)
        refuse_unrun_hooks(pm, module)
        pm.reports.append(
            PluginInfo(module_name, module_name, "gptzoo", version, builtin=True, contract=hookspecs.CONTRACT_VERSION)
        )
    pm.check_pending()
    if third_party:
        entry_points, broken = _entry_points()
        for info, message in broken:
            _failed(pm, info, message, None)
        for ep in sorted(entry_points, key=lambda e: e.name):
            _load_entry_point(pm, ep)
    return pm


def refuse_unrun_hooks(pm: GptzooPluginManager, plugin: object) -> None:
    """Refuse a register hook that calling once would not run: one declared with ``wrapper=True`` or
    ``hookwrapper=True`` (gptzoo calls each plugin's hooks itself, once), a coroutine function (nobody
    awaits it) or a generator function (nobody iterates it). Such a hook would register nothing."""
    for caller in pm.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            if impl.wrapper or impl.hookwrapper:
                option = "wrapper" if impl.wrapper else "hookwrapper"
                raise PluginError(
                    f"its {caller.name} is declared with {option}=True, which gptzoo never runs; declare it with a "
                    "plain @gptzoo.hookimpl"
                )
            if inspect.isasyncgenfunction(impl.function):
                raise PluginError(
                    f"its {caller.name} is an async generator function (async def with yield), which gptzoo never "
                    "iterates; define it with a plain def, without yield"
                )
            if inspect.iscoroutinefunction(impl.function):
                raise PluginError(
                    f"its {caller.name} is a coroutine function (async def), which gptzoo never awaits; define it "
                    "with a plain def"
                )
            if inspect.isgeneratorfunction(impl.function):
                raise PluginError(
                    f"its {caller.name} is a generator function (it yields), which gptzoo never iterates; define it "
                    "without yield"
                )


NAME_FIELD = re.compile(r"^Name:[ \t]*(.*?)[ \t\r]*$", re.MULTILINE | re.IGNORECASE)


def _dist_name(dist: metadata.Distribution) -> str:
    """The Name field of the distribution's metadata, found in the file's header lines: ``dist.metadata``
    parses the whole file as an email, which for every installed distribution took as long as the rest
    of building the registry."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found = NAME_FIELD.search(text.split("\n\n", 1)[0])
    return found.group(1) if found and found.group(1) else "unknown"


def _entry_points() -> tuple[list[metadata.EntryPoint], list[tuple[PluginInfo, str]]]:
    """The group's entry points, one distribution of each name (the first on sys.path, as
    importlib.metadata does), and a failure for each distribution whose entry_points.txt declares
    the group but cannot be parsed (importlib.metadata.entry_points() would raise for all)."""
    seen: set[str] = set()
    found: list[metadata.EntryPoint] = []
    broken: list[tuple[PluginInfo, str]] = []
    only = only_distributions()
    for dist in metadata.distributions():
        name = _dist_name(dist)
        key = canonical_name(name)
        if key in seen or (only is not None and key not in only):
            continue
        seen.add(key)
        try:
            found += [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        except Exception as exc:  # a malformed entry_points.txt
            if f"[{ENTRY_POINT_GROUP}]" in (dist.read_text("entry_points.txt") or ""):
                info = PluginInfo(name, "unknown", name, dist.version or "unknown", builtin=False)
                broken.append((info, f"its entry_points.txt cannot be parsed ({describe_failure(exc, 'reading it')})"))
    return found, broken


def only_distributions() -> frozenset[str] | None:
    """$GPTZOO_ONLY_PLUGINS: the (normalized) distributions whose plugins are loaded, or None for all."""
    raw = os.environ.get(ONLY_PLUGINS_ENV)
    if raw is None:
        return None
    return frozenset(canonical_name(part.strip()) for part in raw.split(",") if part.strip())


def declared_contract(plugin: object, info: PluginInfo) -> int | None:
    """The contract version a loaded plugin declares (None: it declares none); a PluginError for a
    declaration that is not a version, or names one newer than this gptzoo supports."""
    attribute = hookspecs.CONTRACT_ATTRIBUTE
    declared = getattr(plugin, attribute, None)
    if declared is None:
        return None
    if type(declared) is not int or declared < 1:
        raise PluginError(
            f"its {attribute} is {safe_repr(declared)[:60]}, not a contract version; set {attribute} = "
            f"{hookspecs.CONTRACT_VERSION}, the version it is written for"
        )
    supported = hookspecs.CONTRACT_VERSION
    if declared > supported:
        raise PluginError(
            f"it is written for gptzoo plugin contract {declared} ({attribute} = {declared}), and gptzoo "
            f"{gptzoo_version()} supports contracts up to {supported}; upgrade gptzoo (pip install -U gptzoo), "
            f"or install a release of {info.distribution} written for contract {supported}"
        )
    return declared


def _failed(pm: GptzooPluginManager, info: PluginInfo, message: str, cause: BaseException | None) -> None:
    if pm.strict:
        raise PluginError(strict_failure(info, f"failed to load: {message}")) from cause
    pm.reports.append(replace(info, status="failed", error=message))


def _load_entry_point(pm: GptzooPluginManager, ep: metadata.EntryPoint) -> None:
    dist = ep.dist
    try:
        module = ep.module
    except AttributeError:  # importlib.metadata's pattern did not match: not "module" or "module:attr"
        module = None
    info = PluginInfo(
        name=ep.name,
        module=module or ep.value,
        distribution=_dist_name(dist) if dist is not None else "unknown",
        version=(dist.version or "unknown") if dist is not None else "unknown",
        builtin=False,
    )
    if module is None:
        _failed(pm, info, f"its entry point {ep.name} = {ep.value!r} is not 'module' or 'module:attribute'", None)
        return
    if pm.has_plugin(ep.name):
        _failed(pm, info, f"another plugin is already registered under the entry-point name {ep.name!r}", None)
        return
    plugin = None
    try:
        with guarded(info, "importing", pm.warn_s):
            plugin = ep.load()
            info = replace(info, contract=declared_contract(plugin, info))
            pm.register(plugin, name=ep.name)
            pm.check_pending()
            refuse_unrun_hooks(pm, plugin)
    except BaseException as exc:  # a plugin's import may raise anything, even KeyboardInterrupt: report it and go on
        if plugin is not None and pm.get_plugin(ep.name) is plugin:
            pm.unregister(name=ep.name)  # register() can fail half-way (a bad hook signature)
        _failed(pm, info, describe_failure(exc, "at import"), exc)
        return
    pm.reports.append(info if pm.get_hookcallers(plugin) else replace(info, warning=NO_HOOK))

"""The plugin manager: built-in plugins by module name, third-party plugins from entry points.

Third-party plugins are distributions that declare an entry point in the group ``gptzoo``::

    [project.entry-points.gptzoo]
    sqrelu = "gptzoo_sqrelu"

They are loaded one at a time: a plugin that fails to import, implements a misspelled hook or has
a bad hook signature is reported as failed (name, distribution, error) and the others keep working.
``GPTZOO_NO_PLUGINS=1`` skips third-party plugins; ``GPTZOO_STRICT_PLUGINS=1`` (or strict=True)
makes any failure fatal. Nothing is loaded at import time: each call builds a fresh manager.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Literal

import pluggy

from gptzoo import hookspecs
from gptzoo.errors import PluginError, describe_exception

ENTRY_POINT_GROUP = "gptzoo"
NO_PLUGINS_ENV = "GPTZOO_NO_PLUGINS"
STRICT_ENV = "GPTZOO_STRICT_PLUGINS"
DEFAULT_PLUGINS = (
    "gptzoo.builtins.norms",
    "gptzoo.builtins.activations",
    "gptzoo.builtins.mlps",
    "gptzoo.builtins.positions",
    "gptzoo.builtins.attentions",
    "gptzoo.builtins.samplers",
)
"""The built-in plugins, registered first and in this order (as pytest's ``default_plugins``)."""


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


class GptzooPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers each plugin's load report."""

    def __init__(self, *, strict: bool) -> None:
        super().__init__(hookspecs.PROJECT)
        self.strict = strict
        self.reports: list[PluginInfo] = []
        self.add_hookspecs(hookspecs)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


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


def get_plugin_manager(*, third_party: bool | None = None, strict: bool | None = None) -> GptzooPluginManager:
    """A fresh plugin manager with the built-in plugins and (unless disabled) third-party ones."""
    if third_party is None:
        third_party = not env_flag(NO_PLUGINS_ENV)
    if strict is None:
        strict = env_flag(STRICT_ENV)
    pm = GptzooPluginManager(strict=strict)
    version = gptzoo_version()
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
        pm.reports.append(PluginInfo(module_name, module_name, "gptzoo", version, builtin=True))
    pm.check_pending()
    if third_party:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            _load_entry_point(pm, ep)
    return pm


def _load_entry_point(pm: GptzooPluginManager, ep: metadata.EntryPoint) -> None:
    dist = ep.dist
    info = PluginInfo(
        name=ep.name,
        module=ep.module,
        distribution=dist.metadata["Name"] if dist is not None else "unknown",
        version=dist.version if dist is not None else "unknown",
        builtin=False,
    )
    plugin = None
    try:
        if pm.has_plugin(ep.name):
            raise PluginError(f"another plugin is already registered under the entry-point name {ep.name!r}")
        plugin = ep.load()
        pm.register(plugin, name=ep.name)
        pm.check_pending()
    except (Exception, SystemExit) as exc:  # a plugin's import may raise anything; report it and go on
        if plugin is not None and pm.get_plugin(ep.name) is plugin:
            pm.unregister(name=ep.name)  # register() can fail half-way (a bad hook signature)
        message = describe_exception(exc)
        if pm.strict:
            raise PluginError(strict_failure(info, f"failed to load: {message}")) from exc
        pm.reports.append(replace(info, status="failed", error=message))
        return
    pm.reports.append(info)

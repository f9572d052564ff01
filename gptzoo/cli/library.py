"""How a command reaches the library: its imports (Ctrl-C there did nothing) and the one registry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gptzoo.cli.console import Console, warn
from gptzoo.errors import Interrupted
from gptzoo.registry import Registry, get_registry


@contextmanager
def importing() -> Iterator[None]:
    """Around a command's imports of the library, which load torch (a second or more): Ctrl-C there did
    nothing, and says so."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("nothing was done") from None


def command_registry(err: Console) -> Registry:
    """The one registry a command validates, builds and loads with; failed plugins, and refused subsystem
    registrations of plugins that loaded, are warnings."""
    registry = get_registry()
    for info in registry.failed:
        message = f"plugin {info.name!r} ({info.distribution} {info.version}) failed: {info.error}"
        warn(err, f"{message}; see `gptzoo plugins`")
    for info in registry.plugins:
        for refusal in info.refused:
            warn(err, f"plugin {info.name!r} ({info.distribution} {info.version}) loaded, but {refusal}")
    return registry

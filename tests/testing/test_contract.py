"""Every registered component, built-in or third-party, passes the conformance kit (gptzoo.testing):
the same checks a plugin author runs with ``conformance(kind, name)`` and ``gptzoo plugins --check``."""

from __future__ import annotations

from gptzoo.testing import conformance_all

test_component = conformance_all()

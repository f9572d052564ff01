"""The kit as pytest tests: one test function parametrized over the planned checks, so that a plugin
author's test module needs one line."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from gptzoo.registry import Entry, Registry, get_registry
from gptzoo.testing.checks import Planned
from gptzoo.testing.runner import planned_checks, run_check


def as_test(planned: list[Planned]) -> Callable[[Planned], None]:
    """A pytest test function over these checks, ids ``kind:name-check``; a skipped check skips."""

    @pytest.mark.parametrize("planned", planned, ids=[f"{p.entry.kind}:{p.entry.name}-{p.check}" for p in planned])
    def test_conformance(planned: Planned) -> None:
        result = run_check(planned)
        if result.status == "skipped":
            pytest.skip(result.detail)
        if result.status == "failed":
            pytest.fail(f"{result.id}: {result.detail}", pytrace=False)

    return test_conformance


def conformance(kind: str, name: str, *, registry: Registry | None = None) -> Callable[[Planned], None]:
    """Every check of one registered component, as a test function: bind it to a name starting with
    ``test_`` in a test module (``test_my_plugin = conformance("attention", "ring_window")``).
    ``registry`` defaults to a fresh one of every installed plugin."""
    registry = registry if registry is not None else get_registry()
    return as_test(planned_checks(registry, [registry.get(kind, name)]))


def conformance_all(
    registry: Registry | None = None, entries: Iterable[Entry] | None = None
) -> Callable[[Planned], None]:
    """Every check of every registered component (or of ``entries``), as one test function."""
    registry = registry if registry is not None else get_registry()
    return as_test(planned_checks(registry, registry.all_entries() if entries is None else entries))

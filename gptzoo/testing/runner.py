"""Running planned checks: each one's outcome as a :class:`CheckResult`, whatever the plugin's code
raises (sys.exit and os._exit included) turned into a failed check."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gptzoo.errors import GptzooError, exception_text
from gptzoo.plugin_manager import describe_raised, exit_guard
from gptzoo.registry import Entry, Registry
from gptzoo.testing.checks import Planned, plan
from gptzoo.testing.harness import one_line
from gptzoo.testing.results import CheckResult, Failed, Skipped

MAX_DETAIL = 300
"""The longest detail line."""


def planned_checks(registry: Registry, entries: Iterable[Entry]) -> list[Planned]:
    """Every check of these components, in order (nothing runs yet but reading ``examples``)."""
    return [p for entry in entries for p in plan(registry, entry)]


def run_check(planned: Planned) -> CheckResult:
    """Run one check, with torch's global random state left as it was."""
    status, detail = "passed", ""
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), exit_guard():
            detail = planned.run() or ""
    except KeyboardInterrupt:
        raise
    except Failed as exc:
        status, detail = "failed", str(exc)
    except Skipped as exc:
        status, detail = "skipped", str(exc)
    except GptzooError as exc:
        status, detail = "failed", exception_text(exc)
    except BaseException as exc:  # the plugin's code may raise anything
        status, detail = "failed", f"raised {describe_raised(exc)}"
    detail = one_line(detail)
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 3] + "..."
    entry, provenance = planned.entry, planned.entry.provenance
    return CheckResult(
        entry.kind, entry.name, provenance.distribution, provenance.version, planned.check, status, detail
    )


def run_conformance(registry: Registry, entries: Iterable[Entry]) -> list[CheckResult]:
    """Run every conformance check of these components (entries of ``registry``, whose other
    components are the partners of pairings), in order; no pytest needed."""
    return [run_check(p) for p in planned_checks(registry, entries)]

"""Older forms of the plugin contract's members: one :class:`Change` per change a plugin written for
an earlier contract version could notice (:data:`CHANGES`, the changelog of docs/plugins.md), and
what gptzoo does with a component that still has the old form: adapt it, with one
gptzoo.errors.GptzooWarning, or refuse it with a PluginError naming the component, its plugin, the
member, the old and new forms and the fix.

The form is told from the member's signature on the built object (``inspect``), never by calling
it and catching a TypeError (gptzoo.plugin_code.adapt_old_forms applies the table to everything a
factory builds). A plugin that declares a contract version at or after a change's
(gptzoo.hookspecs.CONTRACT_ATTRIBUTE) says it was written for the new form: an old form there is a
mistake, refused rather than adapted.

A later change is one more row: the version that makes it, the kinds and member, both forms, how to
tell the old one from a signature, and an adapter (None: the old form is refused). An adapter that
returns the member unchanged keeps it, with the warning: the row of a method that a later contract
reads through a hook instead, whose default implementation still calls the method, is
``adapt=lambda member: member`` and ``is_old=lambda signature: True``.

A name that moved from one module to another is a row of gptzoo.moves.MOVES.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gptzoo.hookspecs import CONTRACT_ATTRIBUTE, CONTRACT_VERSION
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Entry, culprit


@dataclass(frozen=True)
class Change:
    """One change of a member's form, made by contract ``version``."""

    version: int
    kinds: tuple[str, ...]
    member: str
    old: str
    """The form before, as a plugin author writes it: ``flops(seq_len)``."""
    new: str
    fix: str
    """What the plugin's author changes, as the end of a sentence."""
    is_old: Callable[[inspect.Signature], bool]
    """Whether the member's signature (of the bound method) is the old form."""
    adapt: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    """The old member -> a callable of the new form; None: the old form is refused."""
    adapted_as: str = ""
    """What the adapter computes, in words (``batch * flops(seq_len)``)."""


def binds(signature: inspect.Signature, n: int) -> bool:
    """Whether the signature accepts ``n`` positional arguments."""
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True


def takes_no_arguments(method: object) -> bool:
    """Whether ``method`` is callable with no arguments: a member the contract calls so (a sampler's
    ``reset``, contract 4; a component's ``stats``, contract 5) that wants some is a method of the
    plugin's own that happens to share the name, e.g. one written before that contract: it is left alone."""
    if not callable(method):
        return False
    try:
        inspect.signature(method).bind()
    except TypeError:
        return False
    except ValueError:  # a signature that cannot be read: called as the contract says
        return True
    return True


def flops_per_sequence(old: Callable[..., Any]) -> Callable[..., Any]:
    """``flops(seq_len)`` counted one sequence of seq_len tokens; ``flops(batch, seq_len)`` counts
    batch of them. The FLOPs of a cache-less forward are linear in the batch (every sequence runs
    the same matmuls, independently), so batch times the old count, part by part, is the new one."""

    def flops(batch: int, seq_len: int) -> dict[str, int]:
        return {part: batch * count for part, count in old(seq_len).items()}

    return flops


CHANGES: tuple[Change, ...] = (
    Change(
        version=2,
        kinds=("mlp", "attention"),
        member="flops",
        old="flops(seq_len)",
        new="flops(batch, seq_len)",
        fix="count the FLOPs of batch sequences of seq_len tokens in def flops(self, batch, seq_len)",
        is_old=lambda signature: binds(signature, 1) and not binds(signature, 2),
        adapt=flops_per_sequence,
        adapted_as="batch * flops(seq_len)",
    ),
)
"""Every change of a member's form, oldest first."""


def form_of(member: object) -> inspect.Signature | None:
    """The signature of a built object's member, or None when it has none to read (then nothing is adapted)."""
    if not callable(member):
        return None
    try:
        return inspect.signature(member)
    except (TypeError, ValueError):
        return None


def refusal(entry: Entry, change: Change) -> str | None:
    """Why a component with the old form of ``change`` is refused, or None when it is adapted."""
    declare = f"declare {CONTRACT_ATTRIBUTE} = {CONTRACT_VERSION}"
    fix = f"fix the plugin ({change.fix}, and {declare}), or choose another {entry.kind}"
    if entry.contract is not None and entry.contract >= change.version:
        return (
            f"{culprit(entry)} declares plugin contract {entry.contract} ({CONTRACT_ATTRIBUTE} = {entry.contract}) but "
            f"implements {change.old}, the form before contract {change.version}, which calls {change.new}; {fix}"
        )
    if change.adapt is None:
        return (
            f"{culprit(entry)} implements {change.old}, the form before plugin contract {change.version}, which "
            f"gptzoo {gptzoo_version()} no longer supports: it calls {change.new}; {fix}"
        )
    return None


def adapted(entry: Entry, change: Change) -> str:
    """The warning about a component whose old form is adapted."""
    return (
        f"{culprit(entry)} implements {change.old}, the form before plugin contract {change.version}, which calls "
        f"{change.new}; gptzoo adapts it as {change.adapted_as} for now: {change.fix}, and declare "
        f"{CONTRACT_ATTRIBUTE} = {CONTRACT_VERSION} in the plugin"
    )

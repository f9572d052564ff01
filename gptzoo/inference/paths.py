"""Which path a decoding step takes, and why: one native call ("native"), native calls around the eager
forwards of the components that have no lowering ("native+eager"), or the model's eager forward
("eager"). The engine (gptzoo.inference.engine) reports a :class:`DecodePath` each time it plans a
batch's step; ``gptzoo generate`` shows it (``--json``: its "decode" object).
"""

from __future__ import annotations

from dataclasses import dataclass

from gptzoo.inference.decode_plan import CompiledStep
from gptzoo.inference.matvec import MAX_ROWS
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.model.gpt import GPT
from gptzoo.registry import Reference, Registry, class_key

NATIVE, SPLIT, EAGER = "native", "native+eager", "eager"
"""The decoding paths: one native call per step; native calls around the eager forwards of the
components without a lowering; the model's eager forward."""
LOWERING_FIX = 'register a lowering with register_decode_lowerings (docs/plugins.md, "Fast CPU decoding")'
"""How a component's author makes it decode natively."""


@dataclass(frozen=True)
class EagerComponent:
    """A component class whose modules run their eager forward within each native decoding step."""

    component: str
    """The class, ``module.Qualname``."""
    kind: str | None
    """Its kind and the name it is registered by (None: not a registered component, e.g. a block)."""
    name: str | None
    origin: str | None
    """The distribution and version that registered it (``gptzoo-extras 1.2.0``)."""
    modules: int
    """How many modules of the model it is."""
    reason: str
    """Why the plan runs it eagerly (e.g. ``... has no decode lowering``)."""

    def describe(self) -> str:
        """``gz_unitnorm.UnitNorm (norm "unitnorm" of gptzoo-fake-unitnorm 1.0, 5 modules)``."""
        registered = f'{self.kind} "{self.name}" of {self.origin}, ' if self.name is not None else ""
        return f"{self.component} ({registered}{self.modules} module{'s' if self.modules != 1 else ''})"

    def as_json(self) -> dict[str, object]:
        return {
            "component": self.component,
            "kind": self.kind,
            "name": self.name,
            "origin": self.origin,
            "modules": self.modules,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DecodePath:
    """Which path decoded (:data:`NATIVE`, :data:`SPLIT` or :data:`EAGER`), why not the native
    step where the model's eager forward decoded, and the components run eagerly on the split path."""

    path: str
    reason: str | None = None
    missing: tuple[EagerComponent, ...] = ()

    @property
    def message(self) -> str | None:
        """One line for a person when decoding is not fully native (None when it is)."""
        if self.path == SPLIT:
            parts = "; ".join(f"{c.describe()}: {c.reason}" for c in self.missing)
            return f"decoding natively around the torch forward of {parts}; to decode it natively too, {LOWERING_FIX}"
        if self.path == EAGER:
            return f"decoding with the model's eager forward, not the native CPU step: {self.reason}"
        return None

    def as_json(self) -> dict[str, object]:
        """``{"path", "reason", "missing", "fix"}``, as ``generate --json``'s "decode" object."""
        return {
            "path": self.path,
            "reason": self.reason,
            "missing": [c.as_json() for c in self.missing],
            "fix": LOWERING_FIX if self.missing else None,
        }


def _registered(registry: Registry | None, cls: type) -> tuple[str | None, str | None, str | None]:
    """The kind, name and origin ``cls`` is registered by in ``registry`` (Nones: it is not)."""
    for entry in registry.all_entries() if registry is not None else ():
        target = entry.target
        if target is cls or (isinstance(target, Reference) and str(target) == class_key(cls)):
            return entry.kind, entry.name, entry.provenance.origin
    return None, None, None


def decode_path(model: GPT, step: CompiledStep | None, reason: str | None) -> DecodePath:
    """The path of a generation that decodes with ``step`` (None: the eager forward, for ``reason``)."""
    if step is None:
        return DecodePath(EAGER, reason)
    if not step.eager:
        return DecodePath(NATIVE)
    found: dict[tuple[type, str], int] = {}
    for part in step.eager:
        key = (type(part.module), part.reason)
        found[key] = found.get(key, 0) + 1
    registry = getattr(model, "registry", None)
    missing = tuple(
        EagerComponent(f"{cls.__module__}.{cls.__qualname__}", *_registered(registry, cls), count, why)
        for (cls, why), count in found.items()
    )
    return DecodePath(SPLIT, missing=missing)


def why_eager(model: GPT, batch: int) -> str:
    """Why a generation of ``batch`` rows cannot decode through the native kernels at all."""
    device = model.wte.weight.device
    if library() is None:
        return f"no native kernels: {unavailable_reason()}"
    if device.type != "cpu":
        return f"the model is on {device} (the native step runs on the CPU)"
    if batch > MAX_ROWS:
        return f"a batch of {batch} rows (the native step takes 1 to {MAX_ROWS})"
    return "no layer of the model computes through the native kernels"

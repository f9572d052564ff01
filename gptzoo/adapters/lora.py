"""Low-rank adapters on a model's projections: LoRA (Hu et al., 2021), rsLoRA's scaling (Kalajdzievski,
2023) and DoRA's weight decomposition (Liu et al., 2024), computed as peft computes them.

:class:`LoRALinear` takes the place of an ``nn.Linear`` (it is one: ``weight`` and ``bias`` are the
frozen base's own tensors, so everything that reads a projection's weight keeps working) and adds, for
each adapted part of its output rows (gptzoo.adapters.targets), ``scale * B A x`` with A (r, in) and
B (rows, r). With DoRA the part's rows become ``m / ||W + scale B A|| * (W + scale B A) x + bias``, the
norm taken per output row and not differentiated (DoRA's section 4.3, as peft does). :func:`attach`
wraps a model's targets, :func:`merge` folds them back into plain ``nn.Linear`` weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Part:
    """One target's rows in one projection of the model."""

    target: str
    """``attn.q``: the block's child, the path of the projection's owner inside it, the part's name."""
    linear: str
    """The projection's path in the model (``blocks.3.attn.c_attn``)."""
    name: str
    """The part's name inside that projection (``q``): its adapter tensors are named after it."""
    start: int
    stop: int


@dataclass(frozen=True)
class LoRASpec:
    """How each adapted part is shaped and scaled."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    dora: bool = False
    rslora: bool = False

    @property
    def scale(self) -> float:
        """alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` whose output parts (name, start, stop) each carry a low-rank adapter."""

    def __init__(self, base: nn.Linear, parts: Sequence[tuple[str, int, int]], spec: LoRASpec) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.spec = spec
        self.parts = sorted(parts, key=lambda p: p[1])
        self.scales = {name: spec.scale for name, _, _ in self.parts}
        """Each part's scale: the spec's, or (an adapter peft wrote, :func:`gptzoo.adapters.peft_format.attach_peft`)
        its module's own rank_pattern / alpha_pattern."""
        device, r = base.weight.device, spec.rank
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        self.lora_magnitude = nn.ParameterDict()
        for name, start, stop in self.parts:
            a = torch.empty(r, self.in_features, device=device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # peft's and nn.Linear's default
            self.lora_A[name] = nn.Parameter(a)
            self.lora_B[name] = nn.Parameter(torch.zeros(stop - start, r, device=device))
            if spec.dora:
                rows = base.weight.detach()[start:stop].float()
                self.lora_magnitude[name] = nn.Parameter(rows.norm(dim=1))
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        self._merged: tuple[tuple[object, ...], Tensor] | None = None

    def delta(self, name: str) -> Tensor:
        """scale * B A of one part, (rows, in)."""
        return self.scales[name] * (self.lora_B[name] @ self.lora_A[name])

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        pieces, at = [], 0
        for name, start, stop in self.parts:
            if start > at:
                pieces.append(y[..., at:start])
            pieces.append(self._part(x, y[..., start:stop], name, start, stop))
            at = stop
        if at < self.out_features:
            pieces.append(y[..., at:])
        return torch.cat(pieces, dim=-1)

    def _part(self, x: Tensor, base: Tensor, name: str, start: int, stop: int) -> Tensor:
        """The part's rows of the output: its base rows ``base`` (bias included) with the adapter's term."""
        a, b = self.lora_A[name], self.lora_B[name]
        dropped = self.dropout(x)
        inner = dropped if torch.is_autocast_enabled() else dropped.to(a.dtype)
        lora = F.linear(F.linear(inner, a), b)
        lora = lora * self.scales[name]
        if not self.spec.dora:
            return base + lora.to(base.dtype)
        w = self.weight[start:stop]
        with torch.no_grad():
            norm = (w.float() + self.delta(name).detach().float()).norm(dim=1)
        factor = (self.lora_magnitude[name] / norm).to(base.dtype)  # (rows,)
        bias = self.bias[start:stop] if self.bias is not None else None
        if isinstance(self.dropout, nn.Identity) or not self.training:
            plain = base - bias if bias is not None else base  # x W^T of these rows
            return base + (factor - 1) * plain + factor * lora.to(base.dtype)
        plain = F.linear(dropped, w)  # peft's path with dropout: the rescaled base sees the dropped input
        return base + (factor - 1) * plain + factor * lora.to(base.dtype)

    def merged_weight(self) -> Tensor:
        """The base weight with every part's adapter folded in, in the base weight's dtype; kept until a tensor it
        is made of changes (an optimizer step, a load), so that decoding builds it once."""
        tensors = [self.weight, *self.lora_A.values(), *self.lora_B.values(), *self.lora_magnitude.values()]
        key = tuple((t.data_ptr(), t.dtype, t._version) for t in tensors) + tuple(self.scales.items())
        if self._merged is None or self._merged[0] != key:
            self._merged = (key, self._merge())
        return self._merged[1]

    @torch.no_grad()
    def _merge(self) -> Tensor:
        w = self.weight.detach().float().clone()
        for name, start, stop in self.parts:
            rows = w[start:stop] + self.delta(name).float()
            if self.spec.dora:
                rows = rows * (self.lora_magnitude[name].float() / rows.norm(dim=1)).unsqueeze(1)
            w[start:stop] = rows
        return w.to(self.weight.dtype)


def attach(model: nn.Module, parts: Iterable[Part], spec: LoRASpec) -> dict[str, LoRALinear]:
    """Wrap the projections holding ``parts`` in LoRALinear modules (A drawn from the global RNG, B zero),
    and freeze every other parameter; the wrapped modules by path."""
    for p in model.parameters():
        p.requires_grad_(False)
    by_linear: dict[str, list[tuple[str, int, int]]] = {}
    for part in parts:
        by_linear.setdefault(part.linear, []).append((part.name, part.start, part.stop))
    wrapped = {}
    for path, rows in by_linear.items():
        parent_path, _, attribute = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        wrapper = LoRALinear(getattr(parent, attribute), rows, spec)
        setattr(parent, attribute, wrapper)
        wrapped[path] = wrapper
    return wrapped


def adapted(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's LoRALinear modules by path."""
    return {path: m for path, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def merge(model: nn.Module) -> None:
    """Replace every LoRALinear by a plain nn.Linear holding its merged weight (and the same bias)."""
    for path, wrapper in adapted(model).items():
        parent_path, _, attribute = path.rpartition(".")
        plain = nn.Linear(wrapper.in_features, wrapper.out_features, bias=wrapper.bias is not None, device="meta")
        plain.weight = nn.Parameter(wrapper.merged_weight(), requires_grad=False)
        plain.bias = wrapper.bias
        setattr(model.get_submodule(parent_path), attribute, plain)


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors by their paths in the model (``blocks.0.attn.c_attn.lora_A.q``)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_" in k}

"""What a model offers low-rank adapters: its projections, by the names of the components that own them.

A target is a set of output rows of one ``nn.Linear`` inside each block's component: ``attn.q`` is the
query rows of every layer's fused ``c_attn``, ``mlp.down`` every layer's ``c_proj``. A component's plain
``nn.Linear`` modules are targets by their attribute paths (``attn.q_a``; the index of a module list is
left out: ``mlp.experts.c_fc`` is that projection of every expert), so a plugin's attention or MLP is
adaptable with no adapter code of its own. A fused projection may be split into named row ranges
(``c_attn`` into q, k and v): :data:`PARTS` holds the built-ins' splits, rows of a gptzoo.class_table
keyed by the class that owns the projection and the attribute (the nearest base class's, as for Hugging
Face layouts), and a plugin adds its own through the ``register_adapter_parts`` hook
(gptzoo.adapters.hooks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import nn

from gptzoo.adapters.hooks import ADAPTER_PARTS
from gptzoo.adapters.lora import LoRALinear, Part
from gptzoo.class_table import ClassTable, Row
from gptzoo.errors import GptzooError, suggest
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Provenance, Registry

Split = Callable[[Any], Sequence[tuple[str, int]]]
"""A module -> (part name, rows) of one of its projections, in row order, covering all its rows (-1: the rest)."""


def _qkv(attn: Any) -> Sequence[tuple[str, int]]:
    # an output gate's rows sit among the query's (each head's query, then its gate), as in q_proj of Qwen3.5
    q, kv = (
        (2 if getattr(attn, "output_gate", False) else 1) * attn.n_head * attn.head_dim,
        attn.n_kv_head * attn.head_dim,
    )
    return (("q", q), ("k", kv), ("v", kv))


def _gate_up(mlp: Any) -> Sequence[tuple[str, int]]:
    d_ff = mlp.c_proj.in_features
    return (("gate", d_ff), ("up", d_ff))


def _deltanet(net: Any) -> Sequence[tuple[str, int]]:
    k, v = net.key_heads * net.key_dim, net.heads * net.value_dim
    return (("q", k), ("k", k), ("v", v), ("z", v))


def _named(name: str) -> Split:
    return lambda module: ((name, -1),)


BUILTIN = Provenance("gptzoo.adapters", "gptzoo", gptzoo_version())

PARTS: tuple[Row, ...] = tuple(
    Row(key, attribute, split, BUILTIN)
    for key, splits in {
        "gptzoo_plugins._attentions:CausalSelfAttention": {"c_attn": _qkv, "c_proj": _named("o")},
        "gptzoo_plugins._mla:LatentAttention": {"c_proj": _named("o")},
        "gptzoo_plugins._gated_deltanet:GatedDeltaNet": {
            "in_proj": _deltanet,
            "gate_proj": lambda net: (("b", net.heads), ("a", net.heads)),
            "c_proj": _named("o"),
        },
        "gptzoo_plugins._kda:KimiDeltaAttention": {
            "in_proj": lambda net: tuple((name, net.heads * net.head_size) for name in "qkv"),
            "c_proj": _named("o"),
        },
        "gptzoo_plugins._mamba2:Mamba2": {
            "in_proj": lambda net: (
                ("z", net.inner),
                ("x", net.inner),
                ("b", net.groups * net.state),
                ("c", net.groups * net.state),
                ("dt", net.heads),
            ),
            "c_proj": _named("o"),
        },
        "gptzoo_plugins._short_conv:ShortConv": {
            "in_proj": lambda conv: (("b", conv.d_model), ("c", conv.d_model), ("x", conv.d_model)),
            "c_proj": _named("o"),
        },
        "gptzoo_plugins._mlps:DenseMLP": {"c_fc": _named("up"), "c_proj": _named("down")},
        "gptzoo_plugins._mlps:GatedMLP": {"c_fc": _gate_up, "c_proj": _named("down")},
        "gptzoo_plugins._moe:Expert": {
            "c_fc": lambda e: _gate_up(e) if e.gated else (("up", -1),),
            "c_proj": _named("down"),
        },
    }.items()
    for attribute, split in splits.items()
)
"""The built-ins' split projections: one row per owner class and attribute (the facet), its parts (rows -1:
the rest of them)."""


def _split(owner: nn.Module, attribute: str, linear: nn.Linear, table: ClassTable) -> list[tuple[str, int, int]]:
    match = table.find(type(owner), attribute)
    if match is None:
        return [(attribute, 0, linear.out_features)]
    rows, start = [], 0
    for name, size in match.row.value(owner):
        size = linear.out_features - start if size < 0 else size
        rows.append((name, start, start + size))
        start += max(size, 0)
    sizes = [stop - begin for _, begin, stop in rows]
    if start != linear.out_features or min(sizes, default=0) < 1:
        raise GptzooError(
            f"the adapter parts of {match.row.key}.{attribute} are {sizes} rows, but it has "
            f"{linear.out_features}: its register_adapter_parts split is wrong"
        )
    return rows


def plain_linear(module: nn.Module) -> bool:
    """An adaptable projection: an nn.Linear itself (a subclass such as a router is not one)."""
    return type(module) is nn.Linear or type(module) is LoRALinear


def model_parts(model: nn.Module, registry: Registry | None = None) -> list[Part]:
    """Every part of every projection of the model's blocks, in module order."""
    table = ClassTable.of(ADAPTER_PARTS, PARTS, registry)
    parts = []
    for i, block in enumerate(model.blocks):  # type: ignore[union-attr,arg-type]
        for child, component in block.named_children():
            for path, module in component.named_modules():
                if not plain_linear(module):
                    continue
                owner_path, _, attribute = path.rpartition(".")
                owner = component.get_submodule(owner_path) if owner_path else component
                prefix = ".".join(p for p in [child, *owner_path.split(".")] if p and not p.isdigit())
                for name, start, stop in _split(owner, attribute, module, table):
                    parts.append(Part(f"{prefix}.{name}", f"blocks.{i}.{child}.{path}", name, start, stop))
    return parts


def offered(parts: Iterable[Part]) -> dict[str, list[Part]]:
    """Target name -> its parts (one a layer, or more: the experts)."""
    table: dict[str, list[Part]] = {}
    for part in parts:
        table.setdefault(part.target, []).append(part)
    return table


def select(table: dict[str, list[Part]], asked: Sequence[str]) -> list[str]:
    """The target names ``asked`` means: full names (``attn.q``), a short name that only one target
    ends with (``q``), or ``all``; one error listing every name that is none of these."""
    chosen: list[str] = []
    problems = []
    for name in asked:
        if name == "all":
            chosen += table
            continue
        if name in table:
            chosen.append(name)
            continue
        matches = [t for t in table if t.endswith("." + name)]
        if len(matches) == 1:
            chosen.append(matches[0])
        elif matches:
            problems.append(f"{name!r} is ambiguous: {' or '.join(matches)}")
        else:
            problems.append(f"{name!r} is not a target of this model{suggest(name, list(table))}")
    if problems:
        raise GptzooError(
            f"--targets: {'; '.join(problems)}; the model's targets are {', '.join(table)} (short names work where "
            "only one target ends with them; `gptzoo finetune MODEL --list-targets` shows them)"
        )
    return list(dict.fromkeys(chosen))


DEFAULT_TARGETS = ("q", "v")
"""What is adapted without --targets: the query and value projections (LoRA's paper, peft's and litgpt's default)."""


def default_targets(table: dict[str, list[Part]]) -> list[str]:
    found = [t for t in table if re.search(r"\.(q|v)$", t)]
    if not found:
        raise GptzooError(
            f"the model has no q and v projections to adapt by default; choose --targets among {', '.join(table)}"
        )
    return found

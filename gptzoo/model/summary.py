"""What a model is made of and what it costs: components with provenance, parameters by part,
forward FLOPs by component, training FLOPs per token, KV-cache and weight memory, and the cost of
decoding one token at the context length (FLOPs and bytes read).

Everything is computed from a model built on the meta device, so even gpt2-xl takes no memory.
"""

from __future__ import annotations

from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gptzoo.decode_cost import decode_cost
from gptzoo.defaults import DTYPE_NAMES
from gptzoo.errors import terminal_text
from gptzoo.flops import FLOPS_CONVENTION, TRAIN_FORWARD_RATIO, forward_flops
from gptzoo.memory import format_bytes
from gptzoo.model.gpt import GPT
from gptzoo.model.kv_cache import KVCache
from gptzoo.recipe import Component, Recipe
from gptzoo.recipe.schema import MULTIPLIERS
from gptzoo.registry import Entry
from gptzoo.tables import WholeWords

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
SHAPE_KEYS = (
    "n_layer",
    "n_embd",
    "n_head",
    "n_kv_head",
    "head_dim",
    "d_ff",
    "vocab_size",
    "context_length",
    "norm_placement",
    "bias",
    "tie_embeddings",
)
LAYER_SHAPE_KEYS = ("scale_embeddings", "logit_softcap")
"""Shape keys shown only when they are set."""


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parameter_counts(model: GPT) -> dict[str, Any]:
    """Parameters by part; a tied head counts 0 (it is the token embedding). Parts sum to total."""
    blocks = model.blocks
    per_block = {
        "attention": sum(_numel(b.attn) for b in blocks),
        "mlp": sum(_numel(b.mlp) for b in blocks),
        "norms": sum(_numel(getattr(b, name)) for b in blocks for name in b.norms()),
    }
    counts = {
        "token_embedding": model.wte.weight.numel(),
        "position": sum(_numel(p) for p in model.positions),
        "blocks": sum(per_block.values()),
        "final_norm": _numel(model.ln_f),
        "head": 0 if model.tied else model.lm_head.weight.numel(),
    }
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    assert total == sum(counts.values()), "parameter parts must add up to the total"
    return {
        **counts,
        "blocks_by_part": per_block,
        "tied": model.tied,
        "total": total,
        "active": total - sum(_numel(m) - m.active_parameters() for m in model.declaring("active_parameters")),
        "non_embedding": total - counts["token_embedding"] - counts["position"],
    }


def schedule(recipe: Recipe) -> dict[str, Any]:
    """The layer type of each block, the pattern in short (``(sliding x5, full) x3``), the layers of each
    type (no types, and so no layers of each, without a pattern), and the norm placement of each type
    placed otherwise than [model] says."""
    spec = recipe.model
    pattern = list(spec.layer_pattern)
    layers = spec.schedule() if pattern else []  # without a pattern every block is [model]'s: no types
    return {
        "pattern": pattern,
        "layers": layers,
        "text": schedule_text(pattern, spec.n_layer) if pattern else f"{spec.n_layer} x the same block",
        "count": {name: layers.count(name) for name in dict.fromkeys(layers)},
        "norm_placement": {
            name: spec.placement(name) for name in dict.fromkeys(layers) if spec.placement(name) != spec.norm_placement
        },
    }


def schedule_text(pattern: list[str], n_layer: int) -> str:
    """``(sliding x5, full) x3``: runs of a type within the pattern, and how often the pattern repeats
    (with the layers of a last partial repeat after a +)."""
    runs: list[list[Any]] = []
    for name in pattern:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    inner = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in runs)
    repeats, rest = divmod(n_layer, len(pattern))
    text = f"({inner}) x{repeats}" if len(runs) > 1 else f"{inner.split(' x')[0]} x{len(pattern) * repeats}"
    if rest:
        text += " + " + schedule_text(pattern[:rest], rest) if rest > 1 else f" + {pattern[0]}"
    return text


def summarize(
    model: GPT,
    recipe: Recipe,
    entries: dict[str, tuple[Entry, Component]],
    *,
    batch: int,
    seq_len: int | None = None,
) -> dict[str, Any]:
    """A JSON-ready description of the model at (batch, seq_len); seq_len defaults to the context length."""
    seq_len = seq_len or recipe.model.context_length
    model.check_length(seq_len, f"--seq-len {seq_len}", f"give at most {model.max_positions}")
    flops = forward_flops(model, batch, seq_len)
    forward = sum(flops.values())
    params = parameter_counts(model)
    components = [
        {
            "key": key,
            "kind": entry.kind,
            "name": entry.name,
            "params": component.kwargs,
            "plugin": entry.provenance.plugin,
            "distribution": entry.provenance.distribution,
            "version": entry.provenance.version,
            "overrides": str(entry.overrides) if entry.overrides else None,
        }
        for key, (entry, component) in entries.items()
    ]
    layers = schedule(recipe)
    of_type = {name: [i for i, t in enumerate(layers["layers"]) if t == name] for name in layers["count"]}
    by_type = {
        name: {
            "layers": layers["count"][name],
            **{dt_name: kv_bytes_per_token(model, seq_len, dt, of_type[name]) for dt_name, dt in DTYPES.items()},
        }
        for name in layers["count"]
    }
    state_by_type = {
        name: {
            "layers": layers["count"][name],
            **{dt_name: state_bytes(model, seq_len, dt, of_type[name]) for dt_name, dt in DTYPES.items()},
        }
        for name in layers["count"]
    }
    decode = {name: decode_cost(model, seq_len, dt) for name, dt in DTYPES.items()}
    first = next(iter(decode.values()))
    return {
        "recipe": {
            "name": recipe.name,
            "source": recipe.source,
            "description": recipe.description,
            "resolved": recipe.to_dict(),
        },
        "shape": {
            **{k: getattr(recipe.model, k) for k in SHAPE_KEYS},
            **{k: getattr(recipe.model, k) for k in LAYER_SHAPE_KEYS if getattr(recipe.model, k)},
            **{k: getattr(recipe.model, k) for k in MULTIPLIERS if getattr(recipe.model, k) != 1.0},
        },
        "schedule": layers,
        "components": components,
        "params": params,
        "flops": {
            "convention": FLOPS_CONVENTION,
            "batch": batch,
            "seq_len": seq_len,
            "forward": forward,
            "by_component": flops,
            "forward_per_token": forward // (batch * seq_len),
            "train_per_token": TRAIN_FORWARD_RATIO * forward // (batch * seq_len),
        },
        "decode": {
            "cache_len": seq_len,
            "flops_per_token": sum(part["flops"] for part in first.values()),
            "bytes_read_per_token": {name: sum(p["bytes"] for p in parts.values()) for name, parts in decode.items()},
            "by_component": {
                part: {"flops": cost["flops"], "bytes": {name: decode[name][part]["bytes"] for name in DTYPES}}
                for part, cost in first.items()
            },
        },
        "memory": {
            "weights_bytes": {name: params["total"] * dt.itemsize for name, dt in DTYPES.items()},
            "kv_cache_bytes_per_token": {name: kv_bytes_per_token(model, seq_len, dt) for name, dt in DTYPES.items()},
            "state_bytes_per_sequence": {name: state_bytes(model, seq_len, dt) for name, dt in DTYPES.items()},
            "kv_cache_bytes_per_token_by_layer_type": by_type,
            "state_bytes_per_sequence_by_layer_type": state_by_type,
        },
    }


def kv_bytes_per_token(model: GPT, seq_len: int, dtype: torch.dtype, layers: list[int] | None = None) -> int:
    """The KV cache's bytes per token of one sequence of seq_len tokens, as the attentions of these
    layers (default: all) size their caches (``kv_bytes``), less their constant-size state
    (:func:`state_bytes`): exact for layers that keep every key, an average over seq_len for one that
    keeps a window (rounded up)."""
    attentions = _attentions(model, layers)
    total = KVCache.bytes_needed(attentions, 1, seq_len, dtype)
    return -(-(total - KVCache.state_bytes_needed(attentions, 1, seq_len, dtype)) // seq_len)


def state_bytes(model: GPT, seq_len: int, dtype: torch.dtype, layers: list[int] | None = None) -> int:
    """The bytes of one sequence's cache in these layers (default: all) that do not grow with its length:
    the states of recurrent and convolutional mixers (``state_bytes``, contract 8)."""
    return KVCache.state_bytes_needed(_attentions(model, layers), 1, seq_len, dtype)


def _attentions(model: GPT, layers: list[int] | None) -> list[torch.nn.Module]:
    """The token mixers of these layers (default: all)."""
    return [block.attn for block in (model.blocks if layers is None else [model.blocks[i] for i in layers])]


def _by_layer_type(table: Table, rows: dict[str, dict[str, int]]) -> None:
    """The rows of a memory figure's split by layer type, under the figure's own row."""
    for name, row in rows.items():
        table.add_row(
            f"  of which {row['layers']} {escape(terminal_text(name))} layers", *(format_bytes(row[n]) for n in DTYPES)
        )


def _si(n: float, unit: str = "") -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {prefix}{unit}"
    return f"{n:g} {unit}".strip()


def render_summary(s: dict[str, Any], console: Console) -> None:
    r = s["recipe"]
    name, description, source = (escape(terminal_text(r[k])) for k in ("name", "description", "source"))
    overrides = " ".join(f"--set {escape(terminal_text(o))}" for o in r.get("overrides", ()))
    if overrides:  # the description is the base recipe's: say what changed it
        name = f"{name}[/bold] with [bold]{overrides}"
        description = f"(the base recipe: {description})" if description else ""
    console.print(f"[bold]{name}[/bold]  {description}\n[dim]{source}[/dim]")
    console.print(" ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s["shape"].items()))
    if s["schedule"]["pattern"]:
        counts = ", ".join(f"{n} {escape(terminal_text(t))}" for t, n in s["schedule"]["count"].items())
        placed = s["schedule"]["norm_placement"]
        counts += "".join(f"; {escape(terminal_text(t))}: norm_placement={p}" for t, p in placed.items())
        console.print(f"layers: {escape(terminal_text(s['schedule']['text']))}  ({counts})")

    table = Table(title="Components", title_justify="left")
    for col in ("key", "component", "parameters", "from"):
        table.add_column(col)
    for c in s["components"]:
        params = ", ".join(f"{k}={v}" for k, v in c["params"].items())
        origin = f"{c['plugin']} ({c['distribution']} {c['version']})"
        if c["overrides"]:
            origin += f", overrides {c['overrides']}"
        key = c["key"].removeprefix("layer_types.")  # a layer type's: sliding.attention
        table.add_row(*(escape(terminal_text(text)) for text in (key, c["name"], params, origin)))
    console.print(WholeWords(table))

    p = s["params"]
    table = Table(title="Parameters", title_justify="left")
    table.add_column("part")
    table.add_column("count", justify="right")
    table.add_column("share", justify="right")
    rows = [("token embedding", p["token_embedding"]), ("position", p["position"])]
    rows += [(f"blocks: {k}", v) for k, v in p["blocks_by_part"].items()]
    rows += [
        ("final norm", p["final_norm"]),
        ("lm head" + (" (tied to token embedding)" if p["tied"] else ""), p["head"]),
    ]
    for name, n in rows:
        table.add_row(name, f"{n:,}", f"{100 * n / p['total']:.1f}%")
    table.add_row("[bold]total[/bold]", f"[bold]{p['total']:,}[/bold]", "100.0%")
    if p["active"] != p["total"]:
        table.add_row("active per token", f"{p['active']:,}", f"{100 * p['active'] / p['total']:.1f}%")
    console.print(WholeWords(table))

    f = s["flops"]
    table = Table(
        title=f"Forward FLOPs at batch {f['batch']} x {f['seq_len']} tokens ({f['convention']})", title_justify="left"
    )
    table.add_column("component")
    table.add_column("FLOPs", justify="right")
    table.add_column("share", justify="right")
    for name, n in f["by_component"].items():
        table.add_row(name, _si(n, "FLOP"), f"{100 * n / f['forward']:.1f}%")
    table.add_row("[bold]forward[/bold]", f"[bold]{_si(f['forward'], 'FLOP')}[/bold]", "100.0%")
    table.add_row("forward per token", _si(f["forward_per_token"], "FLOP"), "")
    table.add_row("training per token (3x forward)", _si(f["train_per_token"], "FLOP"), "")
    table.add_row(
        f"decoding a token at {s['decode']['cache_len']} cached", _si(s["decode"]["flops_per_token"], "FLOP"), ""
    )
    console.print(WholeWords(table))

    mem = s["memory"]
    table = Table(title="Memory", title_justify="left")
    table.add_column("")
    for name in DTYPES:
        table.add_column(name, justify="right")
    table.add_row("weights", *(format_bytes(mem["weights_bytes"][n]) for n in DTYPES))
    table.add_row(
        f"KV cache per token (at {s['flops']['seq_len']} tokens)",
        *(format_bytes(mem["kv_cache_bytes_per_token"][n]) for n in DTYPES),
    )
    split = s["schedule"]["pattern"]
    if split:  # the KV cache's split, under its row
        _by_layer_type(table, mem["kv_cache_bytes_per_token_by_layer_type"])
    if any(mem["state_bytes_per_sequence"].values()):  # a recurrent or convolutional mixer's, whatever the length
        table.add_row("state per sequence", *(format_bytes(mem["state_bytes_per_sequence"][n]) for n in DTYPES))
        if split:
            _by_layer_type(table, mem["state_bytes_per_sequence_by_layer_type"])
    table.add_row(
        f"bytes read decoding a token (at {s['decode']['cache_len']} cached)",
        *(format_bytes(s["decode"]["bytes_read_per_token"][n]) for n in DTYPES),
    )
    console.print(WholeWords(table))

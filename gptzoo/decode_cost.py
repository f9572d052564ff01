"""What decoding one token costs at a cache length: matmul FLOPs and bytes read, by component.

Each component reports its own through the contract's optional ``decode_cost(cache_len, dtype)``
(contract 3); one without it gets the default derivation here: FLOPs of its forward over one token
(its ``flops(1, 1)``), plus, for an attention, one multiply-add per cached value it reads; bytes of its
active parameters, plus, for an attention, its cache at that length (``kv_bytes(1, cache_len, dtype)``).
The model's cost adds the LM head and the token embedding's row.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from gptzoo.errors import PluginError
from gptzoo.flops import linear_flops


def component_decode_cost(module: nn.Module, cache_len: int, dtype: torch.dtype) -> dict[str, int]:
    """``{"flops": F, "bytes": B}`` of one new token of one sequence after cache_len cached tokens:
    the component's ``decode_cost`` if it declares one, else the default derivation (module docstring)."""
    declared = getattr(module, "decode_cost", None)
    if callable(declared):
        cost = declared(cache_len, dtype)
        if not (isinstance(cost, dict) and set(cost) == {"flops", "bytes"}) or any(
            type(v) is not int or v < 0 for v in cost.values()
        ):
            raise PluginError(
                f"{type(module).__name__}.decode_cost({cache_len}, {dtype}) gave {cost!r}, not "
                '{"flops": int >= 0, "bytes": int >= 0}'
            )
        return cost
    flops = sum(module.flops(1, 1).values()) if callable(getattr(module, "flops", None)) else 0
    active = module.active_parameters() if callable(getattr(module, "active_parameters", None)) else None
    params = sum(p.numel() for p in module.parameters()) if active is None else active
    read = params * dtype.itemsize
    if callable(getattr(module, "kv_bytes", None)):
        cached = module.kv_bytes(1, cache_len, dtype)
        flops += 2 * (cached // dtype.itemsize)  # one multiply-add per cached value (exact for plain MHA)
        read += cached
    return {"flops": flops, "bytes": read}


def decode_cost(model: nn.Module, cache_len: int, dtype: torch.dtype) -> dict[str, dict[str, int]]:
    """Per part of a gptzoo.GPT (position, attention, mlp, norms summed over layers; lm head; token
    embedding), the cost of decoding one token after cache_len cached tokens in dtype."""
    parts: dict[str, dict[str, int]] = defaultdict(lambda: {"flops": 0, "bytes": 0})
    named = [("position", p) for p in model.positions]
    parts_of = {"attn": "attention", "mlp": "mlp"}
    named += [(parts_of.get(name, "norms"), getattr(b, name)) for b in model.blocks for name in b.layout]
    named.append(("norms", model.ln_f))
    for name, module in named:
        for key, n in component_decode_cost(module, cache_len, dtype).items():
            parts[name][key] += n
    head = model.lm_head
    parts["lm head"] = {"flops": linear_flops(1, head), "bytes": head.weight.numel() * dtype.itemsize}
    parts["token embedding"] = {"flops": 0, "bytes": model.wte.weight.shape[1] * dtype.itemsize}
    return dict(parts)

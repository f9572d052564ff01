"""Mistakes a plugin author makes that the conformance kit catches with one reason each: a parameter
forward never uses (a norm that forgets its weight, an MoE whose router decides nothing, or decides
only through topk's indices), a norm that does not normalize or mixes positions, a component that
cannot run on int8 linears, and a cache mover that moves the wrong positions (which ``gptzoo serve``
would turn into wrong answers)."""

from __future__ import annotations

import pytest
from fakedist import FakeSite
from test_frontier_plugin import FRONTIER, add_frontier

import gptzoo
from gptzoo.testing import run_conformance

NORMS = """
import torch
from torch import nn

import gptzoo


class Forgetful(nn.Module):
    '''RMSNorm that forgets to scale by its weight.'''

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Scale(nn.Module):
    '''A weight times the input: no normalization at all.'''

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.weight


class OverTime(nn.Module):
    '''RMSNorm over the positions and the features together: later tokens move earlier outputs.'''

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + self.eps) * self.weight


@gptzoo.hookimpl
def register_norms(register):
    register("forgetful", Forgetful)
    register("scale", Scale)
    register("over_time", OverTime)
"""

UNUSED = (
    "got no gradient from a training forward: forward does not use it, or only through a step without a gradient "
    "(an index, a comparison); use it, or do not make it a parameter"
)


def result(kind: str, name: str, check: str) -> tuple[str, str]:
    registry = gptzoo.get_registry()
    (found,) = [r for r in run_conformance(registry, [registry.get(kind, name)]) if r.check == check]
    return found.status, found.detail


def test_a_norm_that_ignores_its_weight_fails(fake_site: FakeSite) -> None:
    fake_site.add("norms", "gptzoo_fake_norms", NORMS)
    assert result("norm", "forgetful", "gradients") == ("failed", f"its parameter 'weight' {UNUSED}")


def test_an_moe_whose_router_decides_nothing_fails(fake_site: FakeSite) -> None:
    idle = "        probs = torch.full(x.shape[:-1] + (self.n_experts,), 1 / self.n_experts, device=x.device)\n"
    routed = "        probs = F.softmax(self.router(x).float(), dim=-1)  # (B, T, E)\n"
    assert routed in FRONTIER
    add_frontier(fake_site, FRONTIER.replace(routed, idle))
    # equal scores: topk always picks experts 0 and 1, and the 2 others (their fc and proj weights and
    # biases) get no gradient either
    assert result("mlp", "routed_moe", "gradients") == (
        "failed",
        f"its parameter 'router.weight' (and 8 more) {UNUSED}",
    )


def test_an_moe_whose_router_only_picks_indices_fails(fake_site: FakeSite) -> None:
    renormalized = "        weights = weights / weights.sum(-1, keepdim=True)\n"
    assert renormalized in FRONTIER
    # the router's scores choose the experts, but every chosen one weighs 1/k: the output has no gradient
    # to the router (only its auxiliary loss would)
    add_frontier(fake_site, FRONTIER.replace(renormalized, "        weights = torch.ones_like(weights) / self.top_k\n"))
    assert result("mlp", "routed_moe", "gradients") == ("failed", f"its parameter 'router.weight' {UNUSED}")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "scale",
            "an input 1000 times larger gave an output 1000 times larger (root mean square): it does not normalize; "
            "divide by the input's scale (its RMS, or its standard deviation)",
        ),
        ("over_time", "changing the input at position 8 moved the outputs at other positions by up to "),
    ],
)
def test_a_norm_that_does_not_normalize_each_position_fails(fake_site: FakeSite, name: str, message: str) -> None:
    fake_site.add("norms", "gptzoo_fake_norms", NORMS)
    status, detail = result("norm", name, "normalizes")
    assert status == "failed" and detail.startswith(message)
    assert result("norm", "rmsnorm", "normalizes") == ("passed", "output x1 for input x1000")


FUSED = "        out = self.c_proj(self.act(self.c_fc(x)))\n"
STRICT = "        if type(self.c_fc) is not nn.Linear:\n            raise TypeError('the fused path needs nn.Linear')\n"


def test_a_component_that_cannot_run_on_int8_linears_fails_the_int8_check(fake_site: FakeSite) -> None:
    assert FUSED in FRONTIER
    add_frontier(fake_site, FRONTIER.replace(FUSED, STRICT + FUSED))
    assert result("mlp", "routed_moe", "int8") == (
        "failed",
        "under --dtype int8 its forward raised TypeError: the fused path needs nn.Linear: call its linears (an "
        "Int8Linear's weight reads as the dequantized weight), or register its quantized linears as False (or the "
        "paths of those it may have quantized) with register_quantized_linears",
    )


def test_a_component_that_keeps_its_linears_in_float_passes_the_int8_check(fake_site: FakeSite) -> None:
    declared = "    def flops(self, batch: int, seq_len: int) -> dict[str, int]:\n        n, d, f"
    assert declared in FRONTIER
    kept = FRONTIER.replace(FUSED, STRICT + FUSED).replace(declared, "    int8 = False\n\n" + declared)
    add_frontier(fake_site, kept)
    assert result("mlp", "routed_moe", "int8") == ("passed", "0 linears in int8, 0.0e+00 from float32")


MOVER = """

def move_latent(dst, i, dst_end, src, j, src_end, n):
    dst.latent[i, dst_end - n : dst_end] = src.latent[j, src_end - n : src_end]


@gptzoo.hookimpl
def register_cache_rows(register):
    register(LatentCache, move_latent)
"""
RIGHT = "dst.latent[i, dst_end - n : dst_end] = src.latent[j, src_end - n : src_end]"


@pytest.mark.parametrize(
    ("mover", "detail"),
    [
        (RIGHT, "decoded 24 steps of two sequences (5 and 3 tokens) gathered into one batch"),
        (
            RIGHT.replace("src.latent[j,", "src.latent[0,"),  # always the source cache's first row
            "two sequences gathered into one batch by the mover of LatentCache (register_cache_rows) decode otherwise "
            "than alone: batch row 2 differs at position 3 (rows of 5 and 3 tokens, right-aligned); fix the mover",
        ),
        (
            RIGHT.replace("dst_end - n : dst_end]", ": n]"),  # left-aligned in the batch
            "two sequences gathered into one batch by the mover of LatentCache (register_cache_rows) decode otherwise "
            "than alone: batch row 2 differs at position 3 (rows of 5 and 3 tokens, right-aligned); fix the mover",
        ),
        (None, "served one sequence at a time: its layer cache "),
    ],
)
def test_a_cache_mover_is_held_to_decode_as_each_sequence_alone(
    fake_site: FakeSite, mover: str | None, detail: str
) -> None:
    add_frontier(fake_site, FRONTIER if mover is None else FRONTIER + MOVER.replace(RIGHT, mover))
    status, got = result("attention", "latent", "cache-rows[rope]")
    assert (status, got[: len(detail)]) == ("failed" if mover not in (RIGHT, None) else "passed", detail)

"""Mistakes a plugin author makes that the conformance kit catches with one reason each: a parameter
forward never uses (a norm that forgets its weight, an MoE whose router decides nothing)."""

from __future__ import annotations

from fakedist import FakeSite
from test_frontier_plugin import FRONTIER

import gptzoo
from gptzoo.testing import run_conformance

FORGETFUL = """
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


@gptzoo.hookimpl
def register_norms(register):
    register("forgetful", Forgetful)
"""


def gradients(kind: str, name: str) -> tuple[str, str]:
    registry = gptzoo.get_registry()
    (result,) = [r for r in run_conformance(registry, [registry.get(kind, name)]) if r.check == "gradients"]
    return result.status, result.detail


def test_a_norm_that_ignores_its_weight_fails(fake_site: FakeSite) -> None:
    fake_site.add("forgetful", "gptzoo_fake_forgetful", FORGETFUL)
    assert gradients("norm", "forgetful") == (
        "failed",
        "its parameter 'weight' got no gradient from a training forward: forward does not use it; use it, or do not "
        "make it a parameter",
    )


def test_an_moe_whose_router_decides_nothing_fails(fake_site: FakeSite) -> None:
    idle = "        probs = torch.full(x.shape[:-1] + (self.n_experts,), 1 / self.n_experts, device=x.device)\n"
    routed = "        probs = F.softmax(self.router(x).float(), dim=-1)  # (B, T, E)\n"
    assert routed in FRONTIER
    fake_site.add("idle", "gptzoo_fake_idle", FRONTIER.replace(routed, idle))
    assert gradients("mlp", "routed_moe") == (
        "failed",
        "its parameter 'router.weight' got no gradient from a training forward: forward does not use it; use it, or "
        "do not make it a parameter",
    )

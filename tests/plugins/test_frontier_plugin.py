"""A plugin distribution with the components the frontier families need, through contract 3's public
members only: a FIRE-style learned position that declares its FLOPs (a pairwise MLP over every query-key
distance) and a routed mixture-of-experts MLP with a load-balancing auxiliary loss and its active
parameters. Its FLOPs equal FlopCounterMode (the conformance kit), `gptzoo build` shows total and active
parameters, training logs the auxiliary loss and trains the router on it, and the model generates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_run import run_json
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main
from gptzoo.sweep.matching import MEASURES
from gptzoo.testing import run_conformance
from gptzoo.training import run_dir
from gptzoo.training.trainer import train

FRONTIER = """
import torch
import torch.nn.functional as F
from torch import nn

import gptzoo
from gptzoo.interfaces import Position

gptzoo_contract = 3


class FIRE(Position):
    '''FIRE-style learned position (Li et al., 2023): an additive bias per head from an MLP of the
    log of each query-key distance.'''

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int, width: int = 8) -> None:
        super().__init__()
        self.width, self.n_head = width, n_head
        self.fc1 = nn.Linear(1, width)
        self.fc2 = nn.Linear(width, n_head)

    def attn_bias(self, q_positions, k_positions):
        distance = (q_positions[:, :, None] - k_positions[:, None, :]).clamp(min=0).float()
        features = torch.log1p(distance)[..., None].to(self.fc1.weight.dtype)
        bias = self.fc2(torch.relu(self.fc1(features)))  # (B, Tq, Tk, nh)
        return bias.permute(0, 3, 1, 2).float()

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        return {"fire": 2 * seq_len * seq_len * self.width * (1 + self.n_head)}  # once per forward


class RoutedMoE(nn.Module):
    '''A shared expert plus top-k of n_experts routed experts (each computed densely here, the routing
    weights renormalized over the top k), with the Switch load-balancing loss.'''

    def __init__(self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool, n_experts: int = 4,
                 top_k: int = 2) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.act = n_experts, top_k, activation
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)  # the shared expert
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.experts_fc = nn.ModuleList(nn.Linear(d_model, d_ff, bias=bias) for _ in range(n_experts))
        self.experts_proj = nn.ModuleList(nn.Linear(d_ff, d_model, bias=bias) for _ in range(n_experts))
        self.load_balance = None

    def forward(self, x):
        probs = F.softmax(self.router(x).float(), dim=-1)  # (B, T, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        gate = torch.zeros_like(probs).scatter(-1, chosen, weights).to(x.dtype)  # (B, T, E)
        out = self.c_proj(self.act(self.c_fc(x)))
        for e, (fc, proj) in enumerate(zip(self.experts_fc, self.experts_proj)):
            out = out + gate[..., e : e + 1] * proj(self.act(fc(x)))
        routed = torch.zeros_like(probs).scatter(-1, chosen, 1.0).mean(dim=(0, 1)) / self.top_k  # f_e
        self.load_balance = self.n_experts * (routed * probs.mean(dim=(0, 1))).sum()
        return out

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n, d, f = batch * seq_len, self.c_fc.in_features, self.c_fc.out_features
        return {"router": 2 * n * d * self.n_experts, "experts": 2 * n * 2 * d * f * (1 + self.n_experts)}

    def active_parameters(self) -> int:
        def count(*modules):
            return sum(p.numel() for m in modules for p in m.parameters())

        one = count(self.experts_fc[0], self.experts_proj[0])
        return count(self.router, self.c_fc, self.c_proj) + self.top_k * one

    def aux_losses(self):
        return {} if self.load_balance is None else {"load_balance": self.load_balance}


@gptzoo.hookimpl
def register_positions(register):
    register("fire", FIRE)


@gptzoo.hookimpl
def register_mlps(register):
    register("routed_moe", RoutedMoE)
"""
OVERRIDES = ["model.position=fire", "model.mlp=routed_moe"]


@pytest.fixture
def frontier(fake_site: FakeSite) -> FakeSite:
    fake_site.add("frontier", "gptzoo_fake_frontier", FRONTIER)
    return fake_site


def test_its_components_pass_the_conformance_kit_flops_included(frontier: FakeSite) -> None:
    registry = gptzoo.get_registry()
    entries = [registry.get("position", "fire"), registry.get("mlp", "routed_moe")]
    results = run_conformance(registry, entries)
    failed = [(r.name, r.check, r.detail) for r in results if r.status == "failed"]
    assert failed == []
    flops = {r.name: r.detail for r in results if r.check == "flops"}
    assert set(flops) == {"fire", "routed_moe"}  # a position that declares flops gets the check too
    (accounting,) = [r.detail for r in results if r.check == "accounting"]
    assert accounting.endswith("parameters active; aux losses load_balance")


def test_build_shows_total_and_active_parameters_and_every_components_flops(
    frontier: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    s = run_json(capsys, "build", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)], "--seq-len", "16")
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", OVERRIDES), device="meta")
    d, f, n_layer = model.wte.weight.shape[1], model.recipe.model.d_ff, len(model.blocks)
    expert = 2 * d * f + d + f  # fc and proj, with biases
    assert s["params"]["total"] - s["params"]["active"] == n_layer * 2 * expert  # 2 of 4 experts idle
    fire = model.position
    assert s["flops"]["by_component"]["fire"] == 2 * 16 * 16 * fire.width * (1 + fire.n_head)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("gpt2-tiny", OVERRIDES, registry=registry)
    assert MEASURES["active_params"](recipe, registry) == s["params"]["active"]  # what a sweep matches by
    assert main(["build", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)]]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "active per token" in line]
    assert f"{s['params']['active']:,}" in row


def test_training_logs_the_aux_loss_and_trains_the_router_on_it(
    frontier: FakeSite, stdlib_bytes: Path, tmp_path: Path
) -> None:
    base = [
        *OVERRIDES,
        "model.vocab_size=256",
        "tokenizer.name=bytes",
        "train.seq_len=16",
        "train.micro_batch_size=2",
        "train.max_steps=3",
        "train.log_every=1",
        "train.eval_every=0",
        "train.peak_tflops=1.0",
    ]
    routers = {}
    for weight in ("0", "1.0"):
        out = tmp_path / f"w{weight}"
        train(gptzoo.load_recipe("gpt2-tiny", [*base, f"train.aux_loss_weight={weight}"]), out=out, data=stdlib_bytes)
        records = [r for r in run_dir.read_metrics(out) if "loss" in r]
        balance = [r["aux_load_balance"] for r in records]
        assert len(balance) == 3 and all(math.isfinite(b) and 0.9 < b < 4 for b in balance)  # E * sum f P: 1 if even
        weights, _ = run_dir.load(run_dir.latest(out))
        routers[weight] = weights["blocks.0.mlp.router.weight"]
    assert not torch.equal(routers["0"], routers["1.0"])  # the aux loss reaches the router's gradient


def test_it_generates_and_says_which_path_decoded(frontier: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)], "--prompt", "hello"]
    assert main([*argv, "--max-new-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"][0]) == 3
    # the native plan has no attention bias yet: the model's eager forward decodes, and says why
    assert out["decode"]["path"] == "eager"
    assert out["decode"]["reason"] == "FIRE biases attention (the plan has no attention bias)"


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        (
            ('"load_balance": self.load_balance}', '"load_balance": self.load_balance.detach()}'),
            "aux_losses()['load_balance'] is not in the autograd graph; return the tensor forward computed",
        ),
        (
            ("return count(self.router, self.c_fc, self.c_proj) + self.top_k * one", "return 10**9"),
            "active_parameters() gave 1000000000, not an int between 0 and its 5424 parameters",
        ),
    ],
    ids=["detached-aux-loss", "too-many-active"],
)
def test_the_kit_catches_an_accounting_mistake(fake_site: FakeSite, mutation: tuple[str, str], message: str) -> None:
    assert mutation[0] in FRONTIER
    fake_site.add("mutant", "gptzoo_fake_mutant", FRONTIER.replace(*mutation))
    registry = gptzoo.get_registry()
    (result,) = [r for r in run_conformance(registry, [registry.get("mlp", "routed_moe")]) if r.check == "accounting"]
    assert (result.status, result.detail) == ("failed", message)


def test_a_negative_aux_loss_weight_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_run import run_error

    assert run_error(capsys, "build", "gpt2-tiny", "--set", "train.aux_loss_weight=-1") == (
        "error: --set train.aux_loss_weight=-1: [train] aux_loss_weight=-1.0 must be a finite number >= 0"
    )

"""The built-in mixture of experts (plugins/_moe.py): each routing rule against transformers' routers
(DeepSeek-V2's group-limited greedy, DeepSeek-V3's sigmoid with score correction and top-2 groups,
Qwen's optional renormalization), the experts each token runs, the Switch balance loss, residual
initialization of each expert, its FLOPs against FlopCounterMode, the parameters a recipe may give it
(``gptzoo list mlp moe --parameters``) and its refusals."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_run import run_json
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.training import run_dir
from gptzoo.training.trainer import train
from gptzoo_plugins._moe import MixtureOfExperts


def moe(**params: object) -> MixtureOfExperts:
    torch.manual_seed(0)
    module = MixtureOfExperts(16, 12, activation=nn.SiLU(), bias=False, **params)
    for p in module.parameters():
        nn.init.normal_(p)
    return module


def tokens(n: int = 40) -> torch.Tensor:
    return torch.randn(n, 16, generator=torch.Generator().manual_seed(1))


def hf_router(cls: type, module: MixtureOfExperts, **config: object) -> nn.Module:
    router = cls(SimpleNamespace(hidden_size=16, num_experts_per_tok=module.top_k, **config))
    with torch.no_grad():
        router.weight.copy_(module.router.weight)
        if module.router.score_bias is not None:
            router.e_score_correction_bias.copy_(module.router.score_bias)
    return router


def same_routing(ours: tuple, theirs: tuple) -> None:
    """The same experts with the same weights for every token (in any order within a token)."""
    _, weights, chosen = ours
    _, their_weights, their_chosen = theirs
    order, their_order = chosen.argsort(dim=-1), their_chosen.argsort(dim=-1)
    assert torch.equal(chosen.gather(1, order), their_chosen.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, order), their_weights.float().gather(1, their_order))


def test_deepseek_v2_group_limited_greedy_routing() -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    ours = moe(experts=8, top_k=3, groups=4, group_top_k=2, normalize=False, routed_scale=1.5)
    theirs = hf_router(
        DeepseekV2TopkRouter,
        ours,
        num_experts=8,
        routed_scaling_factor=1.5,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
    )
    x = tokens()
    same_routing(ours.router(x), theirs(x))
    chosen = ours.router(x)[2]
    assert all(len(set((chosen[i] // 2).tolist())) <= 2 for i in range(len(x)))  # from 2 groups of 2 at most


def test_deepseek_v3_sigmoid_routing_with_score_correction() -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    ours = moe(
        experts=8,
        top_k=2,
        scoring="sigmoid",
        score_bias=True,
        groups=2,
        group_top_k=1,
        group_score="top2",
        routed_scale=2.5,
    )
    with torch.no_grad():
        ours.router.score_bias.copy_(torch.linspace(-2, 2, 8))  # large enough to change choices
    theirs = hf_router(
        DeepseekV3TopkRouter,
        ours,
        num_local_experts=8,
        routed_scaling_factor=2.5,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
    )
    x = tokens()
    same_routing(ours.router(x), theirs(x))
    unbiased = moe(experts=8, top_k=2, scoring="sigmoid", groups=2, group_top_k=1, group_score="top2")
    unbiased.load_state_dict({k: v for k, v in ours.state_dict().items() if k != "router.score_bias"}, strict=False)
    assert not torch.equal(unbiased.router(x)[2].sort().values, ours.router(x)[2].sort().values)


@pytest.mark.parametrize("normalize", [False, True])
def test_qwen_routing_renormalizes_only_when_asked(normalize: bool) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    ours = moe(experts=5, top_k=2, normalize=normalize)
    theirs = hf_router(Qwen3MoeTopKRouter, ours, num_experts=5, norm_topk_prob=normalize)
    x = tokens()
    same_routing(ours.router(x), theirs(x))
    sums = ours.router(x)[1].sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums)) == normalize


def test_gpt_oss_routing_is_the_softmax_of_the_top_k_logits() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    ours = moe(experts=7, top_k=3, scoring="topk_softmax", normalize=False, router_bias=True)
    theirs = GptOssTopKRouter(SimpleNamespace(hidden_size=16, num_experts_per_tok=3, num_local_experts=7))
    with torch.no_grad():
        theirs.weight.copy_(ours.router.weight)
        theirs.bias.copy_(ours.router.bias)
    x = tokens()
    same_routing(ours.router(x), theirs(x))
    logits, weights, chosen = ours.router(x)
    probs = logits.softmax(dim=-1)  # the same experts as softmax routing, the weights renormalized over them
    torch.testing.assert_close(weights, probs.gather(1, chosen) / probs.gather(1, chosen).sum(-1, keepdim=True))


def test_gpt_oss_experts_are_the_clamped_swiglu_with_biases() -> None:
    """Each expert computes what transformers' GptOssExperts computes for it (gate and up interleaved
    there), with a limit that the gate and up values cross."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from gptzoo_plugins._activations import QuickGELU

    torch.manual_seed(0)
    ours = MixtureOfExperts(16, 12, activation=QuickGELU(), bias=False, experts=3, top_k=2, expert_bias=True,
                            glu_limit=1.5)  # fmt: skip
    for p in ours.parameters():
        nn.init.normal_(p)
    from transformers import GptOssConfig

    theirs = GptOssExperts(GptOssConfig(intermediate_size=12, num_local_experts=3, hidden_size=16, swiglu_limit=1.5))
    with torch.no_grad():
        for e, expert in enumerate(ours.experts):
            gate, up = expert.c_fc.weight.chunk(2)  # (ff, d) each
            theirs.gate_up_proj[e] = torch.stack((gate.t(), up.t()), dim=-1).reshape(16, 24)
            theirs.gate_up_proj_bias[e] = torch.stack(expert.c_fc.bias.chunk(2), dim=-1).reshape(24)
            theirs.down_proj[e] = expert.c_proj.weight.t()
            theirs.down_proj_bias[e] = expert.c_proj.bias
    x = tokens(9)
    h = ours.experts[0].c_fc(x)
    assert (h[:, :12] > 1.5).any() and (h[:, 12:].abs() > 1.5).any()  # the clamps matter
    _, weights, chosen = ours.router(x)
    torch.testing.assert_close(ours(x[None])[0], theirs(x, chosen, weights))


def test_each_token_runs_its_experts_only() -> None:
    """The output is the weighted sum of the chosen experts' outputs (and the gated shared expert's)."""
    module = moe(experts=5, top_k=2, shared_ff=8, shared_gate=True)
    x = tokens(7)
    _, weights, chosen = module.router(x)
    expected = torch.stack(
        [
            sum(w * module.experts[e](x[i]) for w, e in zip(weights[i], chosen[i].tolist(), strict=True))
            + torch.sigmoid(module.shared_gate(x[i])) * module.shared(x[i])
            for i in range(len(x))
        ]
    )
    torch.testing.assert_close(module(x[None])[0], expected)


def test_balance_loss_is_switchs() -> None:
    """E sum_e f_e P_e: top_k when routing is uniform; what the latest forward computed, in its graph."""
    module = moe(experts=4, top_k=2)
    with torch.no_grad():
        module.router.weight.zero_()  # every expert equally likely: P_e = 1/4
    x = tokens(64)
    module(x[None])
    assert module.aux_losses()["balance"].item() == pytest.approx(2.0)
    nn.init.normal_(module.router.weight)
    module(x[None])
    loss = module.aux_losses()["balance"]
    probs = torch.softmax(module.router(x)[0], dim=-1)
    fraction = torch.bincount(module.router(x)[2].flatten(), minlength=4) / 64
    assert loss.item() == pytest.approx(4 * (fraction * probs.mean(0)).sum().item())
    loss.backward()
    assert module.router.weight.grad.abs().sum() > 0
    assert moe(balance_loss="none").aux_losses() == {}


def test_every_experts_projection_gets_the_residual_scaling() -> None:
    model = gptzoo.build_model("moe-tiny")
    std = 0.02 / math.sqrt(2 * 2)
    for block in model.blocks:
        for expert in block.mlp.experts:
            assert expert.c_proj.weight.std().item() == pytest.approx(std, rel=0.15)
            assert expert.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.15)
        assert block.mlp.router.weight.std().item() == pytest.approx(0.02, rel=0.3)


def test_flops_equal_flop_counter_mode_and_count_top_k_experts() -> None:
    module = moe(experts=6, top_k=3, shared_ff=8, shared_gate=True)
    x = torch.randn(2, 9, 16)
    with FlopCounterMode(display=False) as counter:
        module(x)
    assert sum(module.flops(2, 9).values()) == counter.get_total_flops()
    assert module.flops(2, 9)["experts"] == 3 * 2 * 18 * (16 * 24 + 12 * 16)  # 3 of 6 experts a token
    one = sum(p.numel() for p in module.experts[0].parameters())
    assert module.active_parameters() == sum(p.numel() for p in module.parameters()) - 3 * one


def test_list_shows_the_routing_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    (row,) = run_json(capsys, "list", "mlp", "moe", "--parameters")
    assert row["parameters"] == {
        "experts": 8,
        "top_k": 2,
        "expert_ff": 0,
        "gated": True,
        "scoring": "softmax",
        "normalize": True,
        "routed_scale": 1.0,
        "groups": 1,
        "group_top_k": 1,
        "group_score": "max",
        "score_bias": False,
        "router_bias": False,
        "expert_bias": False,
        "glu_limit": 0.0,
        "shared_ff": 0,
        "shared_gate": False,
        "balance_loss": "switch",
    }


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ("experts=4,top_k=5", "top_k must be between 1 and experts (4), got 5"),
        ("experts=6,groups=4", "groups must divide experts (6) into equal groups, got 4"),
        ("experts=8,groups=4,group_top_k=1,top_k=3", "group_top_k=1 groups of 2 experts hold fewer than top_k=3"),
        ("shared_gate=true", "shared_gate needs a shared expert (shared_ff > 0)"),
        ('scoring="relu"', "scoring must be one of 'softmax', 'sigmoid', 'topk_softmax', got 'relu'"),
        (
            'scoring="topk_softmax",score_bias=true',
            "scoring 'topk_softmax' picks experts by their raw logits; group-limited selection (groups > 1) and "
            "score_bias need every expert's score (scoring 'softmax' or 'sigmoid')",
        ),
        ("glu_limit=-1.0", "glu_limit must be 0 (off) or a positive clamp, got -1.0"),
        (
            "gated=false,glu_limit=7.0",
            "glu_limit clamps a gated expert's gate and up projections; set gated = true or glu_limit = 0",
        ),
    ],
)
def test_contradictory_routing_is_refused_before_allocation(params: str, problem: str) -> None:
    with pytest.raises(RecipeError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        gptzoo.load_recipe("moe-tiny", overrides=[f'model.mlp={{name="moe",{params}}}'])


def test_training_moe_tiny_logs_the_balance_loss(stdlib_bytes: Path, tmp_path: Path) -> None:
    overrides = [
        "model.vocab_size=256",
        "tokenizer.name=bytes",
        "train.seq_len=16",
        "train.micro_batch_size=2",
        "train.max_steps=3",
        "train.log_every=1",
        "train.eval_every=0",
        "train.peak_tflops=1.0",
    ]
    train(gptzoo.load_recipe("moe-tiny", overrides), out=tmp_path / "run", data=stdlib_bytes)
    balance = [r["aux_balance"] for r in run_dir.read_metrics(tmp_path / "run") if "loss" in r]
    assert len(balance) == 3 and all(1.9 < b < 4 for b in balance)  # E sum f P: top_k = 2 when even, at most E

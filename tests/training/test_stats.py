"""Components' statistics in training (contract 5's ``stats``): the MoE's expert load equals a bincount of its
router's choices, a window's mean over micro-batches and steps is logged per layer in metrics.jsonl with its
max/mean (1.0 when balanced) and drawn by `gptzoo plot` in a panel of its own;
a malformed or foreign ``stats`` is refused or left alone."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
import torch
from torch import Tensor, nn

import gptzoo
from gptzoo.errors import PluginError
from gptzoo.training import distributed, run_dir
from gptzoo.training.plot import balance_curves, plot_run
from gptzoo.training.stats import StatWindow
from gptzoo.training.trainer import train
from gptzoo_plugins import _moe
from gptzoo_plugins._moe import MixtureOfExperts

ONE = distributed.Processes(rank=0, world_size=1, device=torch.device("cpu"))
TINY = [
    "model.vocab_size=256",
    "tokenizer.name=bytes",
    "train.seq_len=16",
    "train.micro_batch_size=2",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.peak_tflops=1.0",
]


def test_expert_load_is_the_bincount_of_a_forced_routing() -> None:
    """Router rows are scaled unit vectors and each token is one: token i goes to expert picks[i]."""
    torch.manual_seed(0)
    module = MixtureOfExperts(8, 12, activation=nn.GELU(), bias=False, experts=4, top_k=1)
    with torch.no_grad():
        module.router.weight.copy_(10 * torch.eye(4, 8))
    picks = torch.tensor([0, 0, 1, 0, 2, 1, 0, 1, 2, 0])  # 5, 3, 2, 0 tokens
    module(torch.eye(8)[picks][None])
    load = module.stats()["expert_load"]
    assert load.tolist() == pytest.approx([0.5, 0.3, 0.2, 0.0])
    assert torch.equal(load, torch.bincount(module._chosen.flatten(), minlength=4) / 10)
    window = StatWindow({"blocks.0.mlp": module})
    window.add()
    assert window.flush(ONE) == {
        "expert_load_max_mean": {"blocks.0.mlp": pytest.approx(2.0)},  # 0.5 over the mean 0.25
        "expert_load": {"blocks.0.mlp": [0.5, 0.3, 0.2, 0.0]},
    }


class Reporter(nn.Module):
    def __init__(self, reports: list[dict[str, object]]) -> None:
        super().__init__()
        self.reports = reports

    def stats(self) -> dict[str, object]:
        return self.reports.pop(0)


def test_a_window_logs_the_mean_of_its_micro_batches_and_starts_again() -> None:
    reports = [
        {"load": torch.tensor([1.0, 0.0, 0.0, 0.0]), "z": torch.tensor(2.0)},
        {"load": torch.tensor([0.0, 1.0, 0.0, 0.0]), "z": torch.tensor(4.0)},
        {"load": torch.tensor([0.0, 0.0, 0.5, 0.5]), "z": torch.tensor(6.0)},
        {"load": torch.tensor([0.25] * 4)},
        {"load": torch.full((20,), 0.05)},
    ]
    window = StatWindow({"blocks.1.attn": Reporter(reports)})
    for _ in range(3):
        window.add()
    assert window.flush(ONE) == {
        "load_max_mean": {"blocks.1.attn": pytest.approx(4 / 3)},  # (1/3, 1/3, 1/6, 1/6): max 1/3 over 1/4
        "load": {"blocks.1.attn": [0.33333, 0.33333, 0.16667, 0.16667]},
        "z": {"blocks.1.attn": 4.0},
    }
    window.add()
    assert window.flush(ONE) == {"load_max_mean": {"blocks.1.attn": 1.0}, "load": {"blocks.1.attn": [0.25] * 4}}
    window.add()
    assert window.flush(ONE) == {"load_max_mean": {"blocks.1.attn": pytest.approx(1.0)}}  # 20 entries: not logged
    assert window.flush(ONE) == {}


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        (
            {"loss": torch.tensor(1.0)},
            "its name 'loss' is taken by the training record (its own keys, aux_*, *_max_mean)",
        ),
        ({"load": torch.ones(2, 2)}, "'load' is a 2-D torch.float32 tensor, not a float scalar or 1-D share"),
        ({"load": [0.5, 0.5]}, "'load' is list, not a float scalar or 1-D share"),
    ],
)
def test_a_malformed_report_is_a_plugin_error_naming_the_component(report: dict[str, object], problem: str) -> None:
    window = StatWindow({"blocks.0.mlp": Reporter([report])})
    with pytest.raises(PluginError) as raised:
        window.add()
    assert str(raised.value).startswith(f"the stats() of blocks.0.mlp (test_stats.Reporter): {problem}; ")


class OwnStats(nn.Module):
    """A component written before contract 5 with a ``stats`` method of its own, which takes an argument."""

    def stats(self, x: Tensor) -> float:
        return float(x.mean())


def test_only_a_stats_without_arguments_is_read() -> None:
    model = gptzoo.build_model("moe-tiny", device="meta")
    assert list(model.stat_reporters()) == ["blocks.0.mlp", "blocks.1.mlp"]
    model.blocks[0].extra = OwnStats()
    assert list(model.stat_reporters()) == ["blocks.0.mlp", "blocks.1.mlp"]
    assert list(gptzoo.build_model("gpt2-tiny", device="meta").stat_reporters()) == []


def _records(run: Path) -> list[dict[str, object]]:
    return [r for r in run_dir.read_metrics(run) if "loss" in r]


def test_training_logs_each_layers_load_as_the_bincount_of_its_routers_choices(
    stdlib_bytes: Path, tmp_path: Path
) -> None:
    """grad_accum 2, log_every 2: each record is the mean over 4 forwards, the bincount of their choices."""
    recipe = gptzoo.load_recipe("moe-tiny", [*TINY, "train.max_steps=4", "train.log_every=2", "train.grad_accum=2"])
    torch.manual_seed(recipe.train.seed)
    model = gptzoo.build_model(recipe)
    seen: dict[int, list[Tensor]] = {0: [], 1: []}
    for i, block in enumerate(model.blocks):
        block.mlp.router.register_forward_hook(
            lambda module, args, out, i=i: seen[i].append(out[2].clone()) if module.training else None
        )
    train(recipe, out=tmp_path / "run", data=stdlib_bytes, init=model)
    records = _records(tmp_path / "run")
    assert [r["step"] for r in records] == [2, 4]
    for n, record in enumerate(records):
        for i in (0, 1):
            chosen = torch.cat(seen[i][4 * n : 4 * n + 4])
            expected = torch.bincount(chosen.flatten(), minlength=4) / chosen.numel()
            logged = record["expert_load"][f"blocks.{i}.mlp"]
            assert logged == pytest.approx(expected.tolist(), abs=1e-5)
            assert record["expert_load_max_mean"][f"blocks.{i}.mlp"] == pytest.approx(4 * expected.max().item())


def test_perfectly_balanced_routing_logs_max_mean_one(
    stdlib_bytes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = _moe.Router.forward

    def round_robin(self: _moe.Router, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, weights, _ = forward(self, x)
        slots = torch.arange(x.shape[0] * self.top_k).view(-1, self.top_k)
        return logits, weights, slots % self.experts  # token i: experts 2i, 2i+1 (mod 4)

    monkeypatch.setattr(_moe.Router, "forward", round_robin)
    recipe = gptzoo.load_recipe("moe-tiny", [*TINY, "train.max_steps=3", "train.log_every=1"])
    train(recipe, out=tmp_path / "run", data=stdlib_bytes)
    records = _records(tmp_path / "run")
    assert [r["expert_load_max_mean"] for r in records] == [{"blocks.0.mlp": 1.0, "blocks.1.mlp": 1.0}] * 3
    assert records[0]["expert_load"] == {"blocks.0.mlp": [0.25] * 4, "blocks.1.mlp": [0.25] * 4}
    png = plot_run(tmp_path / "run")
    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (900, 960)  # 8 x 7.5 inches at 120 dpi: the loss, and the balance panel below it
    assert balance_curves(records) == {
        "blocks.0.mlp": [(1, 1.0), (2, 1.0), (3, 1.0)],
        "blocks.1.mlp": [(1, 1.0), (2, 1.0), (3, 1.0)],
    }


def test_plot_of_a_dense_run_has_no_balance_panel(stdlib_bytes: Path, tmp_path: Path) -> None:
    train(
        gptzoo.load_recipe("llama-tiny", [*TINY, "train.max_steps=2", "train.log_every=1"]),
        out=tmp_path / "run",
        data=stdlib_bytes,
    )
    assert balance_curves(run_dir.read_metrics(tmp_path / "run")) == {}
    assert matplotlib.image.imread(plot_run(tmp_path / "run")).shape[:2] == (540, 960)

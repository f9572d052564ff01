"""MFU is never above 100%: the peak it divides by is named (the recipe's peak_tflops, or a matmul
measured at start-up), and a figure the peak cannot explain is dropped (null), not printed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gptzoo
from gptzoo.recipe import TrainSpec
from gptzoo.training import run_dir
from gptzoo.training import trainer as trainer_module
from gptzoo.training.trainer import Peak, mfu_of, peak_of, train

BASE = [
    "model.vocab_size=256",
    "tokenizer.name=bytes",
    "train.seq_len=16",
    "train.micro_batch_size=2",
    "train.max_steps=2",
    "train.log_every=1",
    "train.eval_every=0",
]


def test_an_mfu_above_one_is_dropped() -> None:
    peak = Peak(1e12, "[train] peak_tflops = 1")
    assert mfu_of(2.5e11, peak) == 0.25
    assert mfu_of(1e12, peak) == 1.0
    assert mfu_of(1.5e12, peak) is None  # 150%: the peak is wrong, not the run


def test_the_peak_names_where_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert peak_of(TrainSpec(peak_tflops=2.5), cpu) == Peak(2.5e12, "[train] peak_tflops = 2.5")
    monkeypatch.setattr(trainer_module, "measure_peak_flops", lambda device, precision: 3e11)
    assert peak_of(TrainSpec(), cpu) == Peak(3e11, "measured at start-up: the fastest of 3 2048x2048 float32 matmuls")


def test_a_peak_measured_on_busy_cores_gives_no_mfu_and_says_what_it_was(
    stdlib_bytes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer_module, "measure_peak_flops", lambda device, precision: 1.0)  # far too low
    result = train(gptzoo.load_recipe("gpt2-tiny", BASE), out=tmp_path / "low", data=stdlib_bytes)
    summary = result.summary(tmp_path / "low")
    assert summary["mfu"] is None
    assert summary["peak"] == {
        "flops_per_s": 1.0,
        "source": "measured at start-up: the fastest of 3 2048x2048 float32 matmuls",
    }
    assert [r["mfu"] for r in run_dir.read_metrics(tmp_path / "low") if "loss" in r] == [None, None]
    # a peak the run cannot exceed: every figure is a fraction
    result = train(
        gptzoo.load_recipe("gpt2-tiny", [*BASE, "train.peak_tflops=1e6"]), out=tmp_path / "high", data=stdlib_bytes
    )
    figures = [r["mfu"] for r in run_dir.read_metrics(tmp_path / "high") if "loss" in r]
    assert len(figures) == 2 and all(0 < f < 1 for f in figures)
    assert result.summary(tmp_path / "high")["peak"] == {"flops_per_s": 1e18, "source": "[train] peak_tflops = 1e+06"}

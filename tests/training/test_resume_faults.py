"""A run killed with SIGKILL at any boundary of a step, then resumed, is the run that was not killed:
the same metrics records (but for wall-clock fields), the same weights bit for bit, and for a sweep
the same results and report. Each case kills a child process at one boundary of step 4 (of 6, with
checkpoints at 2, 4 and 6 and an evaluation at each), then resumes in this process. Each kill takes
a few seconds, so only the kill after the rename (the one that lost a point before) is in the fast suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import TRAIN

import gptzoo
from gptzoo.sweep.runner import run_sweep
from gptzoo.sweep.spec import read_spec
from gptzoo.training import run_dir
from gptzoo.training.trainer import train

KILLED_STEP = 4
OVERRIDES = [
    "model.vocab_size=256",
    "tokenizer.name=bytes",
    *TRAIN,
    "train.log_every=1",
    "train.peak_tflops=1.0",
    "train.max_steps=6",
    "train.checkpoint_every=2",
    "train.eval_every=2",
    "train.keep_checkpoints=3",
]
WALL_CLOCK = ("time", "tokens_per_s", "mfu")

KILLER = f'''
"""Kill this process (SIGKILL: no handler, no clean-up) at one boundary of step {KILLED_STEP}."""
import os
import signal

from gptzoo import atomic
from gptzoo.training import run_dir, trainer

STEP = {KILLED_STEP}
phase = {{"step": 0, "saving": 0}}


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def install(boundary):
    train_step, evaluate, loss_of = trainer.Trainer.train_step, trainer.Trainer.evaluate, trainer.loss_of
    append_metrics, write_files, rename = run_dir.append_metrics, run_dir.write_files, os.rename

    def step_wrapper(self):
        phase["step"] = self.step + 1
        result = train_step(self)
        phase["step"] = 0
        if boundary == "after_optimizer" and self.step == STEP:
            die()
        return result

    def loss_wrapper(*args):
        killing = phase["step"] == STEP
        if killing and boundary == "before_forward":
            die()
        loss = loss_of(*args)
        if killing and boundary == "after_forward":
            die()
        return loss

    def evaluate_wrapper(self):
        if boundary == "before_eval" and self.step == STEP:
            die()
        loss = evaluate(self)
        if boundary == "after_eval" and self.step == STEP:
            die()
        return loss

    def metrics_wrapper(run, entry):
        killing = entry["step"] == STEP and "val_loss" in entry
        if killing and boundary == "before_metrics":
            die()
        append_metrics(run, entry)
        if killing and boundary == "after_metrics":
            die()

    def files_wrapper(out, state, recipe, *args, **kwargs):
        write_files(out, state, recipe, *args, **kwargs)
        if boundary == "mid_checkpoint" and phase["saving"] == STEP:
            die()

    def rename_wrapper(src, dst, *args, **kwargs):
        killing = os.path.basename(dst) == f"step-{{STEP:06d}}"
        if killing and boundary == "before_rename":
            die()
        rename(src, dst, *args, **kwargs)
        if killing and boundary == "after_rename":
            die()

    save = trainer.Trainer.save

    def save_wrapper(self):
        phase["saving"] = self.step
        return save(self)

    trainer.Trainer.train_step = step_wrapper
    trainer.Trainer.evaluate = evaluate_wrapper
    trainer.Trainer.save = save_wrapper
    trainer.loss_of = loss_wrapper
    run_dir.append_metrics = metrics_wrapper
    run_dir.write_files = files_wrapper
    atomic.os.rename = rename_wrapper
'''

SLOW = pytest.mark.slow
BOUNDARIES = [
    pytest.param("before_forward", marks=SLOW),
    pytest.param("after_forward", marks=SLOW),
    pytest.param("after_optimizer", marks=SLOW),
    pytest.param("before_eval", marks=SLOW),
    pytest.param("after_eval", marks=SLOW),
    pytest.param("before_metrics", marks=SLOW),
    pytest.param("after_metrics", marks=SLOW),
    pytest.param("mid_checkpoint", marks=SLOW),
    pytest.param("before_rename", marks=SLOW),
    "after_rename",
]


@pytest.fixture(scope="session")
def docs(stdlib_bytes: Path) -> Path:
    return stdlib_bytes


@pytest.fixture(scope="module")
def killer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("killer")
    (folder / "killer.py").write_text(KILLER, encoding="utf-8")
    return folder


def kill_at(killer: Path, boundary: str, code: str) -> None:
    """Run ``code`` in a child process that SIGKILLs itself at ``boundary``; assert that it was killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(killer), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", f"import killer\nkiller.install({boundary!r})\n{code}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -9, (boundary, done.returncode, done.stderr[-2000:])


def records(run: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in run_dir.read_metrics(run)]


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return run_dir.load(run / "checkpoints" / f"step-{step:06d}")[0]


@pytest.fixture(scope="module")
def straight(docs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    train(gptzoo.load_recipe("gpt2-tiny", OVERRIDES), out=out, data=docs)
    return out


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_run_killed_at_any_boundary_of_a_step_resumes_to_the_run_not_killed(
    boundary: str, docs: Path, killer: Path, straight: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    kill_at(
        killer,
        boundary,
        f"import gptzoo\nfrom gptzoo.training.trainer import train\n"
        f"train(gptzoo.load_recipe('gpt2-tiny', {OVERRIDES!r}), out={str(out)!r}, data={str(docs)!r})",
    )
    newest = run_dir.latest(out)
    assert newest is not None and newest.name in ("step-000002", "step-000004")
    train(gptzoo.load_recipe("gpt2-tiny", OVERRIDES), out=out, data=docs, resume=True)
    assert records(out) == records(straight)
    assert [r["step"] for r in records(out) if "val_loss" in r] == [2, 4, 6]
    a, b = weights(out, 6), weights(straight, 6)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_is_renamed_into_place_after_the_records_of_its_step_reach_the_disk(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, events = tmp_path / "run", []
    fsync, rename = os.fsync, os.rename

    def record_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(out / run_dir.METRICS):
            events.append(("fsync", [r["step"] for r in run_dir.read_metrics(out) if "val_loss" in r]))
        fsync(fd)

    def record_rename(src: Any, dst: Any) -> None:
        rename(src, dst)
        if Path(dst).parent == out / "checkpoints":
            events.append(("rename", Path(dst).name))

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "rename", record_rename)
    train(gptzoo.load_recipe("gpt2-tiny", OVERRIDES), out=out, data=docs)
    assert events == [
        ("fsync", [2]),
        ("rename", "step-000002"),
        ("fsync", [2, 4]),
        ("rename", "step-000004"),
        ("fsync", [2, 4, 6]),
        ("rename", "step-000006"),
    ]


SPEC = f"""base = "shakespeare-bytes"
set = {json.dumps([o for o in OVERRIDES if not o.startswith(("train.max_steps", "model.vocab", "tokenizer"))])}
seeds = [0]
target_loss = 3.5
[data]
path = "DATA"
[budget]
steps = 6
[eval]
lengths = [32]
max_tokens = 2000
[[variants]]
name = "pre"
"""


def report_without_timing(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    for run in report["runs"]:
        run.pop("tokens_per_s")
    for variant in report["variants"]:
        variant.pop("tokens_per_s", None)
    report.pop("machine")
    report.pop("seconds")
    return report


@SLOW
@pytest.mark.parametrize("boundary", ["before_metrics", "after_rename"])
def test_a_sweep_killed_between_an_evaluation_and_its_checkpoint_resumes_to_the_same_report(
    boundary: str, docs: Path, killer: Path, tmp_path: Path
) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.replace("DATA", str(docs)), encoding="utf-8")
    run_sweep(read_spec(path), tmp_path / "straight")
    killed = tmp_path / "killed"
    kill_at(killer, boundary, f"from gptzoo.cli import main\nmain(['sweep', {str(path)!r}, '--out', {str(killed)!r}])")
    run_sweep(read_spec(path), killed, resume=True)
    run = Path("runs") / "pre" / "seed-0"
    assert records(killed / run) == records(tmp_path / "straight" / run)
    assert report_without_timing(killed) == report_without_timing(tmp_path / "straight")

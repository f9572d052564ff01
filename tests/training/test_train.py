"""Training: the loss drops on real text, resume is bit-exact, saves are atomic, non-finite steps
are caught, DDP and FSDP2 across processes match one process, and bad input is refused."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import pytest
import torch

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import NonFiniteError
from gptzoo.model.checkpoint import load_checkpoint
from gptzoo.recipe import TrainSpec
from gptzoo.training import run_dir
from gptzoo.training.data import prepare
from gptzoo.training.optim import lr_at, param_groups
from gptzoo.training.trainer import train

TINY = [
    "model.vocab_size=256",
    "tokenizer.name=bytes",
    "train.seq_len=64",
    "train.micro_batch_size=8",
    "train.warmup_steps=4",
    "train.lr=3e-3",
    "train.min_lr=3e-4",
    "train.eval_batches=4",
    "train.log_every=1",
    "train.peak_tflops=1.0",
]
"""gpt2-tiny over UTF-8 bytes: a 2-layer, width-64 model that trains in a few seconds."""


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stdlib-docs as bytes: train.bin / val.bin / meta.json."""
    out = tmp_path_factory.mktemp("data") / "stdlib-docs"
    prepare("stdlib-docs", out, tokenizer="bytes")
    return out


def recipe(*overrides: str) -> gptzoo.Recipe:
    return gptzoo.load_recipe("gpt2-tiny", [*TINY, *overrides])


def losses(run: Path, key: str = "loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in run_dir.read_metrics(run) if key in r}


def test_loss_drops_on_stdlib_docs(docs: Path, tmp_path: Path) -> None:
    result = train(recipe("train.max_steps=40", "train.eval_every=20"), out=tmp_path / "run", data=docs)
    train_loss, val_loss = losses(tmp_path / "run"), losses(tmp_path / "run", "val_loss")
    assert abs(train_loss[1] - math.log(256)) < 0.3  # a fresh model is uniform over the 256 bytes
    assert val_loss[40] < math.log(256) - 2.3  # stated margin: from 5.55 to below 3.25 nats per byte in 40 steps
    assert result.steps == 40 and result.val_loss == val_loss[40] and result.skipped == 0
    assert result.checkpoint == tmp_path / "run" / "checkpoints" / "step-000040"
    model = load_checkpoint(result.checkpoint)  # an ordinary gptzoo checkpoint: generate --checkpoint works
    assert model.recipe.train.max_steps == 40


def test_resume_continues_bit_for_bit(docs: Path, tmp_path: Path) -> None:
    spec = recipe(
        "train.max_steps=8",
        "train.grad_accum=2",
        "train.micro_batch_size=4",
        "train.checkpoint_every=4",
        "train.eval_every=4",
    )
    train(spec, out=tmp_path / "whole", data=docs)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-000008")  # as if stopped after step 4's checkpoint
    train(spec, out=tmp_path / "resumed", data=docs, resume=True)
    for key in ("loss", "val_loss", "grad_norm"):
        assert losses(tmp_path / "resumed", key) == losses(tmp_path / "whole", key)  # ==: bit for bit
    assert len(losses(tmp_path / "resumed")) == 8  # the records after step 4 were logged once, not twice
    a, b = (run_dir.load(tmp_path / name / "checkpoints" / "step-000008") for name in ("whole", "resumed"))
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert a[1]["optimizer"]["state"].keys() == b[1]["optimizer"]["state"].keys()


def test_an_interrupted_save_leaves_the_previous_checkpoint(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves = []
    real_save = torch.save

    def dying_save(obj: object, f: BinaryIO) -> None:
        saves.append(f)
        if len(saves) == 2:  # the second checkpoint: half a file, then the process dies
            f.write(b"\x80\x02half")
            raise KeyboardInterrupt
        real_save(obj, f)

    monkeypatch.setattr(run_dir.torch, "save", dying_save)
    spec = recipe("train.max_steps=4", "train.checkpoint_every=2", "train.eval_every=0")
    with pytest.raises(KeyboardInterrupt):
        train(spec, out=tmp_path / "run", data=docs)
    left = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert left == ["step-000002"]  # no step-000004, and no half-written temporary directory
    tensors, state = run_dir.load(tmp_path / "run" / "checkpoints" / "step-000002")
    assert (
        state["step"] == 2
        and load_checkpoint(tmp_path / "run" / "checkpoints" / "step-000002").recipe.train.max_steps == 4
    )
    monkeypatch.setattr(run_dir.torch, "save", real_save)
    assert train(spec, out=tmp_path / "run", data=docs, resume=True).steps == 4


def _poison_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """The loss of optimizer step ``step`` (1-based) becomes NaN."""
    from gptzoo.training import trainer as train_mod

    real = train_mod.Trainer.train_step

    def poisoned(self: train_mod.Trainer) -> tuple[float, float, bool]:
        if self.step + 1 == step:
            original = train_mod.loss_of
            monkeypatch.setattr(train_mod, "loss_of", lambda *a: original(*a) * float("nan"))
            try:
                return real(self)
            finally:
                monkeypatch.setattr(train_mod, "loss_of", original)
        return real(self)

    monkeypatch.setattr(train_mod.Trainer, "train_step", poisoned)


def test_a_non_finite_loss_stops_the_run_naming_the_step(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _poison_step(monkeypatch, 3)
    with pytest.raises(NonFiniteError) as exc:
        train(
            recipe("train.max_steps=6", "train.checkpoint_every=2", "train.eval_every=0"),
            out=tmp_path / "run",
            data=docs,
        )
    assert str(exc.value) == (
        f"step 3: the loss is nan; nothing was saved for this step, the last checkpoint "
        f"{tmp_path / 'run' / 'checkpoints' / 'step-000002'} is intact: resume with --resume --set "
        "train.on_nonfinite=skip to skip such steps, or start a new run with a lower train.lr or in float32"
    )
    assert [s for s, _ in run_dir.checkpoint_dirs(tmp_path / "run")] == [2]
    (tmp_path / "run" / "checkpoints" / ".step-000004.k3j_x9ab").mkdir()  # what a killed save leaves (mkdtemp's)
    (tmp_path / "run" / "checkpoints" / ".step-notes").mkdir()  # not a save's: it stays
    result = train(
        recipe("train.max_steps=6", "train.checkpoint_every=2", "train.eval_every=0", "train.on_nonfinite=skip"),
        out=tmp_path / "run",
        data=docs,
        resume=True,
    )
    assert result.steps == 6 and result.skipped == 1  # the advice works: step 3 is skipped this time
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        ".step-notes",
        "step-000004",
        "step-000006",
    ]


def test_a_non_finite_step_can_be_skipped(docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _poison_step(monkeypatch, 3)
    result = train(
        recipe("train.max_steps=4", "train.on_nonfinite=skip", "train.eval_every=0"), out=tmp_path / "run", data=docs
    )
    records = {r["step"]: r for r in run_dir.read_metrics(tmp_path / "run") if "loss" in r}
    assert result.skipped == 1 and records[3]["skipped"] and records[3]["loss"] is None  # JSON has no NaN
    assert all(math.isfinite(records[s]["loss"]) for s in (1, 2, 4))
    _, state = run_dir.load(result.checkpoint)
    assert all(torch.isfinite(t).all() for t in load_checkpoint(result.checkpoint).state_dict().values())
    assert state["skipped"] == 1


def _torchrun(script: Path, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


DIST_SCRIPT = """
import os, sys, time
import gptzoo
from gptzoo.training import run_dir
from gptzoo.training.trainer import train
if os.environ["RANK"] == "1":  # a slow second process must not refuse the run directory the first has begun
    others = run_dir.others
    run_dir.others = lambda out: time.sleep(2) or others(out)
overrides = sys.argv[3:]
train(gptzoo.load_recipe("gpt2-tiny", overrides), out=sys.argv[1], data=sys.argv[2])
os._exit(0)  # torch 2.13 + gloo can abort at interpreter exit after DDP (1 to 3 runs in 6); the work is done
"""


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_same_global_batch(docs: Path, tmp_path: Path, parallel: str) -> None:
    common = [*TINY, "train.max_steps=4", "train.micro_batch_size=4", "train.eval_every=2", "train.checkpoint_every=2"]
    train(gptzoo.load_recipe("gpt2-tiny", [*common, "train.grad_accum=2"]), out=tmp_path / "one", data=docs)
    script = tmp_path / "dist_train.py"
    script.write_text(DIST_SCRIPT)
    _torchrun(script, str(tmp_path / "two"), str(docs), *common, "train.grad_accum=1", f"train.parallel={parallel}")
    for key in ("loss", "val_loss"):
        one, two = losses(tmp_path / "one", key), losses(tmp_path / "two", key)
        assert one.keys() == two.keys() and len(one) >= 2
        for step in one:
            assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6)
    a, _ = run_dir.load(tmp_path / "one" / "checkpoints" / "step-000004")
    b, _ = run_dir.load(tmp_path / "two" / "checkpoints" / "step-000004")  # written by rank 0, gathered under FSDP
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5)


RESUME_SCRIPT = DIST_SCRIPT.replace("data=sys.argv[2])", "data=sys.argv[2], resume=True)")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_run_under_torchrun_resumes_bit_for_bit(docs: Path, tmp_path: Path, parallel: str) -> None:
    """The optimizer state of a wrapped model (DDP names its parameters module.*) is restored as it was saved."""
    common = [*TINY, "train.max_steps=4", "train.micro_batch_size=4", "train.eval_every=2", "train.checkpoint_every=2"]
    (tmp_path / "train.py").write_text(DIST_SCRIPT)
    (tmp_path / "resume.py").write_text(RESUME_SCRIPT)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _torchrun(tmp_path / "train.py", str(whole), str(docs), *common, f"train.parallel={parallel}")
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000004")
    _torchrun(tmp_path / "resume.py", str(resumed), str(docs), *common, f"train.parallel={parallel}")
    for key in ("loss", "val_loss", "grad_norm"):
        assert losses(resumed, key) == losses(whole, key)


def test_lr_schedule_warms_up_then_follows_a_cosine_to_min_lr() -> None:
    spec = TrainSpec(max_steps=110, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, spec) == pytest.approx(1e-3 / 11)
    assert lr_at(9, spec) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, spec) == pytest.approx(1e-3)
    spec = TrainSpec(max_steps=111, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(60, spec) == pytest.approx(1e-4 + 0.5 * 9e-4)  # halfway through the cosine
    assert lr_at(110, spec) == pytest.approx(1e-4) and lr_at(500, spec) == pytest.approx(1e-4)
    values = [lr_at(s, spec) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_weight_decay_applies_to_matrices_only() -> None:
    for base, expect_head in (("gpt2-tiny", False), ("llama-tiny", True)):
        model = gptzoo.build_model(gptzoo.load_recipe(base))
        decay, rest = param_groups(model, 0.1)
        assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
        assert all(n.endswith(".weight") and "ln" not in n and "norm" not in n for n in decay["names"])
        assert "wte.weight" in rest["names"] and all(n.endswith(("bias", "weight")) for n in rest["names"])
        assert ("lm_head.weight" in decay["names"]) is expect_head  # a tied head is the embedding: not decayed
        assert len(decay["names"]) + len(rest["names"]) == len(list(model.parameters()))
        assert all(p.ndim >= 2 for p in decay["params"])


def test_cli_train_and_plot(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    sets = [a for o in [*TINY, "train.max_steps=6", "train.eval_every=3"] for a in ("--set", o)]
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and summary["val_loss"] == losses(run, "val_loss")[6]
    assert main(["plot", str(run), "--json"]) == 0
    png = Path(json.loads(capsys.readouterr().out)["png"])
    assert png == run / "loss.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "{tmp}/nowhere"], "no prepared data at {tmp}/nowhere; run `gptzoo prepare"),
        (
            ["--set", "tokenizer.name=gpt2", "--set", "model.vocab_size=50257"],
            "was prepared with the 'bytes' tokenizer, but recipe 'gpt2-tiny' uses 'gpt2'",
        ),
        (["--set", "train.seq_len=4096"], "[train] seq_len=4096 is above the model's context_length=128"),
        (["--resume"], "has no checkpoints to resume"),
        (["--set", "train.precision=float16"], "needs a CUDA GPU"),
    ],
)
def test_cli_train_bad_input(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [a.format(tmp=tmp_path) for a in args]
    if "--data" not in args:
        args += ["--data", str(docs)]
    sets = [a for o in [*TINY, "train.max_steps=2"] for a in ("--set", o)]
    assert main(["train", "gpt2-tiny", *sets, *args, "--out", str(tmp_path / "run")]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "run").exists()  # nothing written


def test_cli_refuses_to_overwrite_or_to_resume_another_recipe(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    sets = [a for o in [*TINY, "train.max_steps=2"] for a in ("--set", o)]
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(run)]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(run)]) == 2
    assert "already holds files; pass --resume" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "gpt2-tiny",
                *sets,
                "--set",
                "model.n_layer=3",
                "--data",
                str(docs),
                "--out",
                str(run),
                "--resume",
            ]
        )
        == 2
    )
    assert "is a checkpoint of a different recipe: [model] n_layer is 2 there, 3 here; resume with" in " ".join(
        capsys.readouterr().err.split()
    )
    assert (
        main(["train", "gpt2-tiny", *sets, "--set", "train.lr=0.1", "--data", str(docs), "--out", str(run), "--resume"])
        == 2
    )
    assert "[train] lr is 0.003 there, 0.1 here" in capsys.readouterr().err.replace("\n", " ")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing overwritten


def test_fine_tuning_starts_from_hugging_face_weights(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import transformers

    from gptzoo.training.data import TokenData, Windows

    torch.manual_seed(3)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)
    ).eval()
    hf.save_pretrained(tmp_path / "hf")
    x, y = Windows(TokenData.open(docs).train, 64, 1337).batch(0, 8)  # the first step's batch (default seed)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(hf(x).logits.view(-1, 256), y.view(-1)).item()
    sets = [a for o in [*TINY, "train.max_steps=1", "train.eval_every=0"] for a in ("--set", o)]
    assert (
        main(
            [
                "train",
                "gpt2-tiny",
                *sets,
                "--data",
                str(docs),
                "--out",
                str(tmp_path / "run"),
                "--init-from-hf",
                str(tmp_path / "hf"),
                "--json",
            ]
        )
        == 0
    )
    assert losses(tmp_path / "run")[1] == pytest.approx(expected, rel=1e-5)
    assert (
        main(
            [
                "train",
                "gpt2-tiny",
                *sets,
                "--set",
                "model.n_layer=3",
                "--data",
                str(docs),
                "--out",
                str(tmp_path / "run3"),
                "--init-from-hf",
                str(tmp_path / "hf"),
            ]
        )
        == 2
    )
    assert "n_layer" in capsys.readouterr().err and not (tmp_path / "run3").exists()


def test_checkpoints_are_pruned_to_the_newest_and_a_finished_run_is_not_resumed(docs: Path, tmp_path: Path) -> None:
    spec = recipe("train.max_steps=6", "train.checkpoint_every=1", "train.keep_checkpoints=2", "train.eval_every=0")
    train(spec, out=tmp_path / "run", data=docs)
    assert [s for s, _ in run_dir.checkpoint_dirs(tmp_path / "run")] == [5, 6]
    with pytest.raises(gptzoo.CheckpointError, match=r"has already trained 6 of max_steps=6; raise train.max_steps"):
        train(spec, out=tmp_path / "run", data=docs, resume=True)
    (tmp_path / "run" / "metrics.jsonl").open("a").write('{"step": 7, "lo')  # a line torn by a killed process
    more = recipe("train.max_steps=8", "train.checkpoint_every=1", "train.keep_checkpoints=2", "train.eval_every=0")
    assert train(more, out=tmp_path / "run", data=docs, resume=True).steps == 8
    assert sorted(losses(tmp_path / "run")) == list(range(1, 9))


@pytest.mark.parametrize(
    "overrides", [["train.precision=bfloat16"], ["train.compile=true"]], ids=["bfloat16", "compile"]
)
def test_bfloat16_autocast_and_compile_train(docs: Path, tmp_path: Path, overrides: list[str]) -> None:
    baseline = train(recipe("train.max_steps=12", "train.eval_every=0"), out=tmp_path / "f32", data=docs)
    result = train(recipe("train.max_steps=12", "train.eval_every=0", *overrides), out=tmp_path / "run", data=docs)
    first, last = losses(tmp_path / "run")[1], result.loss
    assert first == pytest.approx(losses(tmp_path / "f32")[1], abs=0.02 if "bfloat16" in overrides[0] else 1e-4)
    assert last < first - 1.0 and last == pytest.approx(baseline.loss, abs=0.1 if "bfloat16" in overrides[0] else 1e-3)


def test_log_every_must_be_positive() -> None:
    with pytest.raises(gptzoo.RecipeError, match=r"\[train\] log_every=0 must be at least 1"):
        recipe("train.log_every=0")


def test_cli_train_says_where_how_long_and_how_many_steps_first(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the first step: the run directory, the steps and their tokens, and the time at 30% of the peak
    (a [train] peak_tflops makes it exact: 4 steps x 8 x 64 tokens x the FLOPs per token / (0.3 x 1 TFLOP/s)); a
    resumed run estimates what is left at the tokens/s it last logged."""
    from gptzoo.flops import train_flops_per_token
    from gptzoo.training.display import duration

    run = tmp_path / "run"
    sets = [a for o in [*TINY, "train.max_steps=4", "train.peak_tflops=1e-6"] for a in ("--set", o)]
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(run)]) == 0
    err = capsys.readouterr().err
    recipe = gptzoo.load_recipe("gpt2-tiny", [*TINY, "train.max_steps=4"])
    per_step = recipe.train.micro_batch_size * recipe.train.grad_accum * recipe.train.seq_len
    flops = train_flops_per_token(gptzoo.build_model(recipe, device="meta"), recipe.train.seq_len)
    seconds = 4 * per_step * flops / (0.3 * 1e6)
    line = f"training into {run}: 4 steps of {per_step:,} tokens, about {duration(seconds)} "
    line += "(at 30% of the peak 0.001 GFLOP/s)"
    assert err.splitlines()[0] == line
    timed = [line for line in err.splitlines() if line.startswith("step 2 took ")]
    assert len(timed) == 1 and re.fullmatch(
        r"step 2 took \S+ s: about \d+ s left with \d+ evaluations? of \S+ s, \d+ s in all; the estimate before the "
        r"first step said .+",
        timed[0],
    )
    sets[sets.index("train.max_steps=4")] = "train.max_steps=6"
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(run), "--resume"]) == 0
    rate = [r["tokens_per_s"] for r in run_dir.read_metrics(run) if r.get("tokens_per_s") and r["step"] <= 4][-1]
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"resuming {run} at step 4 of 6 steps of {per_step:,} tokens, about {duration(2 * per_step / rate)} "
        f"(at the {rate:,.0f} tokens/s it last logged)"
    )
    assert duration(30) == "30 s" and duration(9 * 60 + 17) == "9 min" and duration(3 * 3600) == "3.0 h"


def test_a_stderr_that_is_not_a_terminal_gets_status_lines(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gptzoo train 2>file` (here capsys: not a terminal) writes a plain line every STATUS_S seconds with the
    step, the statistics and the times, where a terminal gets the live bar (which a file shows only at the end)."""
    from gptzoo import status_lines

    monkeypatch.setattr(status_lines, "STATUS_S", 0.0)  # a line at every logged step
    sets = [a for o in [*TINY, "train.max_steps=4", "train.log_every=1"] for a in ("--set", o)]
    assert main(["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(tmp_path / "run")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gpt2-tiny: step ")]
    assert [line.split()[2] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert re.fullmatch(
        r"gpt2-tiny: step 1/4  loss \d+\.\d{4}  [\d,]+ tok/s  lr \S+(  MFU [\d.]+%)?  \d+ s elapsed, about \d+ s left",
        lines[0],
    )
    assert lines[-1].endswith(" s elapsed")  # nothing left


def test_the_start_line_of_several_processes_counts_each_ones_peak(tmp_path: Path) -> None:
    """Under torchrun every process reaches its own peak: 2 processes take half the time of 1 (the README's
    2-process run was estimated at 21 min and took 7 when the estimate counted one process's peak)."""
    from types import SimpleNamespace

    from gptzoo.training.trainer import Plan, plan_of

    def plan(world_size: int) -> Plan:
        trainer = SimpleNamespace(
            spec=SimpleNamespace(max_steps=100),
            global_batch=8,
            seq_len=64,
            step=0,
            out=tmp_path,
            peak=SimpleNamespace(flops_per_s=1e9),
            flops_per_token=1e6,
            procs=SimpleNamespace(world_size=world_size),
        )
        return plan_of(trainer)

    one, two = plan(1), plan(2)
    assert one.seconds == pytest.approx(100 * 8 * 64 * 1e6 / (0.3 * 1e9))
    assert two.seconds == pytest.approx(one.seconds / 2)
    assert one.basis == "at 30% of the peak 1 GFLOP/s"
    assert two.basis == "at 30% of the peak 1 GFLOP/s in each of 2 processes"


def _slowed(monkeypatch: pytest.MonkeyPatch, method: str, seconds: float) -> None:
    """Trainer.METHOD takes ``seconds`` more: a component the FLOPs do not see (eager, sequential)."""
    import time

    from gptzoo.training.trainer import Trainer

    original = getattr(Trainer, method)

    def slow(self: Trainer, *args: object) -> object:
        time.sleep(seconds)
        return original(self, *args)

    monkeypatch.setattr(Trainer, method, slow)


def test_a_timed_step_says_the_time_left(docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate before the first step counts FLOPs; once the second step (the first warms up) is timed,
    the time left is said from it: the steps left at its time, and the evaluations left (at steps 4, 8 and the
    last, 10) at a third of a step's time per token; said once."""
    _slowed(monkeypatch, "train_step", 0.25)
    plans, timings = [], []
    spec = recipe("train.max_steps=10", "train.eval_every=4", "train.eval_batches=2")
    train(spec, out=tmp_path / "run", data=docs, planned=plans.append, timed=timings.append)
    [timing] = timings
    assert timing.step == 2 and timing.evals == 3 and timing.step_seconds >= 0.25
    per_step, per_eval = 8 * 64, 2 * 8 * 64
    assert timing.eval_seconds == pytest.approx(timing.step_seconds * per_eval / (3 * per_step))
    assert timing.seconds == pytest.approx(8 * timing.step_seconds + 3 * timing.eval_seconds)
    assert timing.seconds >= 8 * 0.25 and timing.elapsed >= 2 * 0.25
    assert timing.estimate == plans[0].seconds
    timings.clear()
    train(recipe("train.max_steps=2"), out=tmp_path / "short", data=docs, timed=timings.append)
    assert timings == []  # nothing left to time against


def test_the_evaluation_before_the_first_step_is_timed(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fine-tune's validation at step 0 is what the evaluations left are counted at."""
    _slowed(monkeypatch, "evaluate", 0.5)
    timings = []
    spec = recipe("train.max_steps=6", "train.eval_every=0")
    train(spec, out=tmp_path / "run", data=docs, timed=timings.append, evaluate_first=True)
    [timing] = timings
    assert timing.evals == 1 and timing.eval_seconds >= 0.5
    assert timing.seconds == pytest.approx(4 * timing.step_seconds + timing.eval_seconds)


def test_the_timed_line() -> None:
    from gptzoo.training.display import timed_line
    from gptzoo.training.trainer import Timing

    timing = Timing(step=2, step_seconds=0.84, seconds=95, elapsed=3, evals=3, eval_seconds=1.5, estimate=51 * 60)
    assert timed_line(timing) == (
        "step 2 took 0.84 s: about 2 min left with 3 evaluations of 1.5 s, 2 min in all; the estimate before the "
        "first step said 51 min"
    )
    one = Timing(step=2, step_seconds=2.0, seconds=40, elapsed=4, evals=1, eval_seconds=0.25, estimate=math.nan)
    assert timed_line(one) == "step 2 took 2 s: about 40 s left with 1 evaluation of 0.25 s, 44 s in all"

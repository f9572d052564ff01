"""CLI-wide rules: one registry per command, --set on a checkpoint, --json errors, Ctrl-C (exit 130),
bugs keep their traceback, and flags out of range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json

import gptzoo
import gptzoo.cli
import gptzoo.inference.generate
import gptzoo.registry
from gptzoo.cli import main
from gptzoo.errors import Interrupted
from gptzoo.inference.sampling import SamplerChain
from gptzoo.model import checkpoint

GENERATE = ("--prompt", "Hi", "--max-new-tokens", "2")
FIT = "(a checkpoint's shapes cannot change)"


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    """A gpt2-tiny checkpoint (2 blocks, width 64, tied head)."""
    model = gptzoo.build_model("gpt2-tiny")
    return gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ck")


def raiser(exc: BaseException):
    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    return fail


def test_each_command_builds_one_registry(
    ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = []
    fill = gptzoo.registry.registry_from
    monkeypatch.setattr(gptzoo.registry, "registry_from", lambda pm: builds.append(pm) or fill(pm))
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 200, encoding="utf-8")
    assert gptzoo.cli.main(["prepare", str(text), "--tokenizer", "bytes", "--out", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    tiny_run = [f"train.{k}" for k in ("max_steps=1", "micro_batch_size=1", "seq_len=16", "eval_batches=1")]
    commands = [
        ["build", "gpt2-tiny", "--set", "model.n_layer=1", "--out", str(tmp_path / "built")],
        ["train", "shakespeare-bytes", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run")]
        + [arg for kv in tiny_run for arg in ("--set", kv)],
        ["generate", "gpt2-tiny", *GENERATE],
        ["generate", "--checkpoint", str(ck), "--set", "model.attention=eager", *GENERATE],
        ["export", str(ck), "--hf", str(tmp_path / "hf")],
        ["build", "gpt2-tiny", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "from-hf")],
        ["compare", "--hf", str(tmp_path / "hf"), "--new-tokens", "2"],
        ["list", "norm"],
    ]
    for argv in commands:
        gptzoo.registry.default_registry.cache_clear()
        builds.clear()
        run_json(capsys, *argv)
        assert len(builds) == 1, argv


def test_generate_checkpoint_applies_and_checks_overrides(ck: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--checkpoint", str(ck), *GENERATE]
    plain = run_json(capsys, *base)
    assert run_json(capsys, *base, "--set", "model.attention=eager")["tokens"] == plain["tokens"]
    more = run_json(capsys, "generate", "--checkpoint", str(ck), "--prompt", "Hi", "--set", "generate.max_new_tokens=5")
    assert len(more["tokens"][0]) == 5
    assert run_error(capsys, *base, "--set", "model.attention=nonexistent") == (
        f"error: {ck / 'recipe.toml'}: [model] attention: unknown attention 'nonexistent' (available: causal, eager)"
    )
    assert run_error(capsys, *base, "--set", "model.n_layer=3") == (
        f"error: --set model.n_layer=3 does not fit the checkpoint {ck}: "
        f"it has 2 blocks' weights, the overridden recipe needs 3 {FIT}"
    )
    assert run_error(capsys, *base, "--set", "model.norm=rmsnorm") == (
        f"error: --set model.norm=rmsnorm does not fit the checkpoint {ck}: "
        f"it has a tensor blocks.0.ln_1.bias that the overridden recipe does not use {FIT}"
    )


def test_hostile_checkpoints_are_user_errors(ck: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    weights = ck / "model.safetensors"
    save_file({k: v.to(torch.int32) for k, v in load_file(weights).items()}, weights)
    assert run_error(capsys, "generate", "--checkpoint", str(ck), *GENERATE) == (
        f"error: {weights}: wte.weight holds int32 values; a checkpoint's weights are floating point "
        "(float32, bfloat16 or float16)"
    )
    (ck / "recipe.toml").write_text("[model\n")
    assert run_error(capsys, "export", str(ck), "--hf", str(ck.parent / "hf")).startswith(
        f"error: {ck / 'recipe.toml'}: invalid TOML: "
    )
    assert run_error(capsys, "generate", "--checkpoint", str(ck.parent / "nowhere"), *GENERATE) == (
        f"error: no such checkpoint directory: {ck.parent / 'nowhere'}"
    )


def test_json_errors_go_to_stdout_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "gpt2-tiny", "--seq-len", "4096", "--json"]) == 2
    captured = capsys.readouterr()
    message = "--seq-len 4096 is longer than the 128 positions gpt2-tiny's learned positions encode"
    assert json.loads(captured.out) == {"error": message, "exit": 2}
    assert captured.err == f"error: {message}\n"
    # usage errors, found by argparse, too
    assert main(["generate", "gpt2-tiny", "--json"]) == 2
    captured = capsys.readouterr()
    message = "gptzoo generate: the following arguments are required: --prompt"
    assert json.loads(captured.out) == {"error": message, "exit": 2}
    assert captured.err.startswith("usage: gptzoo generate ")
    assert captured.err.endswith("\ngptzoo generate: error: the following arguments are required: --prompt\n")
    assert main(["generate", "gpt2-tiny"]) == 2  # without --json, stdout stays empty
    assert capsys.readouterr().out == ""


def test_ctrl_c_while_writing_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "save_file", raiser(KeyboardInterrupt()))
    out = tmp_path / "ck"
    assert main(["build", "gpt2-tiny", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert captured.err == f"interrupted: nothing was written to {out}\n" and captured.out == ""
    assert list(tmp_path.iterdir()) == []  # no temporary directory is left
    assert main(["build", "gpt2-tiny", "--out", str(out), "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"error": f"interrupted: nothing was written to {out}", "exit": 130}
    with pytest.raises(Interrupted):
        main(["build", "gpt2-tiny", "--out", str(out), "--debug"])
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_generating(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    sample = SamplerChain.__call__

    def second_token_interrupted(self: SamplerChain, *args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(SamplerChain, "__call__", second_token_interrupted)
    assert main(["generate", "gpt2-tiny", "--prompt", "Hi", "--max-new-tokens", "5", "--seed", "0"]) == 130
    captured = capsys.readouterr()
    assert captured.out.startswith("Hi") and captured.out.endswith("\n")  # the streamed line is ended
    assert captured.err.splitlines()[-1] == "interrupted" and "Traceback" not in captured.err
    calls.clear()
    assert main(["generate", "gpt2-tiny", *GENERATE, "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"error": "interrupted", "exit": 130}


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (KeyboardInterrupt(), "interrupted"),
        (
            Interrupted("the last complete checkpoint is RUN/step-3"),
            "interrupted: the last complete checkpoint is RUN/step-3",
        ),
    ],
)
def test_ctrl_c_while_training(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, exc: BaseException, line: str
) -> None:
    monkeypatch.setattr(gptzoo.cli, "train", raiser(exc))
    assert main(["train", "gpt2-tiny", "--out", "unused"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == line  # after the progress display's last frame
    assert main(["train", "gpt2-tiny", "--out", "unused", "--json"]) == 130
    captured = capsys.readouterr()
    assert captured.err == f"{line}\n" and json.loads(captured.out) == {"error": line, "exit": 130}


def test_bugs_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gptzoo.inference.generate, "generate_text", raiser(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="^a bug$"):
        main(["generate", "gpt2-tiny", *GENERATE, "--json"])


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        ("Interrupted('kept RUN/step-3')", 130, "interrupted: kept RUN/step-3"),
        ("GptzooError('no data')", 2, "error: no data"),
    ],
)
def test_torchrun_leaves_with_the_exit_status(tmp_path: Path, exc: str, code: int, line: str) -> None:
    script = f"""
import atexit, sys
import gptzoo.cli
import gptzoo.inference.generate
from gptzoo.errors import GptzooError, Interrupted
atexit.register(lambda: print("atexit ran"))
def train(*args, **kwargs):
    raise {exc}
gptzoo.cli.train = train
sys.exit(gptzoo.cli.main(["train", "gpt2-tiny", "--out", {str(tmp_path / "run")!r}, "--json"]))
"""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    error = {"error": line.removeprefix("error: "), "exit": code}
    assert (done.returncode, done.stderr, json.loads(done.stdout)) == (code, f"{line}\n", error)  # no "atexit ran"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "gpt2-tiny", *GENERATE, "--seed", str(2**70)], f"argument --seed: {2**70} is not between"),
        (["generate", "gpt2-tiny", *GENERATE, "--seed", "-1"], "argument --seed: -1 is not between"),
        (["generate", "gpt2-tiny", *GENERATE, "--temperature", "nan"], "argument --temperature: nan is not a finite"),
        (["generate", "gpt2-tiny", *GENERATE, "--top-p", "inf"], "argument --top-p: inf is not a finite number"),
        (["generate", "gpt2-tiny", *GENERATE, "--min-p=-inf"], "argument --min-p: -inf is not a finite number"),
        (["prepare", "x", "--out", "y", "--val-fraction", "nan"], "argument --val-fraction: nan is not a finite"),
    ],
)
def test_flags_out_of_range(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    last = captured.err.splitlines()[-1]
    assert captured.out == "" and last.startswith(f"gptzoo {argv[0]}: error: {message}"), last
    if "--seed" in message:
        assert last.endswith(" is not between 0 and 18446744073709551615 (2**64 - 1)")
    else:
        assert last.endswith(" is not a finite number")


def test_the_largest_seed_works(capsys: pytest.CaptureFixture[str]) -> None:
    first = run_json(capsys, "generate", "gpt2-tiny", *GENERATE, "--seed", str(2**64 - 1), "--temperature", "1")
    again = run_json(capsys, "generate", "gpt2-tiny", *GENERATE, "--seed", str(2**64 - 1), "--temperature", "1")
    assert first["tokens"] == again["tokens"]

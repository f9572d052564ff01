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
import gptzoo.training.trainer
from gptzoo.cli import main
from gptzoo.errors import Interrupted, did_you_mean
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
    available = ", ".join(gptzoo.get_registry().names("attention"))
    assert run_error(capsys, *base, "--set", "model.attention=nonexistent") == (
        f"error: --set model.attention=nonexistent: [model] attention: unknown attention 'nonexistent' "
        f"(available: {available})"
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
        f"error: {weights}: wte.weight holds int32 values; a checkpoint's weights are float32, bfloat16 or float16"
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
    message = "--seq-len 4096 is longer than the 128 positions that LearnedPosition encodes; give at most 128"
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
    assert main(["build", "gpt2-tiny", "--out", str(out), "--debug"]) == 130  # with the traceback
    assert "Traceback (most recent call last):" in capsys.readouterr().err
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
    monkeypatch.setattr(gptzoo.training.trainer, "train", raiser(exc))
    assert main(["train", "gpt2-tiny", "--out", "unused"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == line  # after the progress display's last frame
    assert main(["train", "gpt2-tiny", "--out", "unused", "--json"]) == 130
    captured = capsys.readouterr()
    assert captured.err == f"{line}\n" and json.loads(captured.out) == {"error": line, "exit": 130}


def test_bugs_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gptzoo.inference.generate, "_generate_text", raiser(RuntimeError("a bug")))
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
import gptzoo.training.trainer
from gptzoo.errors import GptzooError, Interrupted
atexit.register(lambda: print("atexit ran"))
def train(*args, **kwargs):
    raise {exc}
gptzoo.training.trainer.train = train
sys.exit(gptzoo.cli.main(["train", "gpt2-tiny", "--out", {str(tmp_path / "run")!r}, "--json"]))
"""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "PYTHONPATH": str(Path(__file__).parents[2])}
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


# --- what reaches stdout and the terminal ------------------------------------------------------------------

PRINTING_PLUGIN = """
import torch

print("a plugin printing at import")


class Loud(torch.nn.Module):
    def __init__(self):
        super().__init__()
        print("a plugin printing in its factory")

    def forward(self, x):
        return x


@gptzoo.hookimpl
def register_activations(register):
    print("a plugin printing while it registers")
    register("loud", Loud, doc="an activation that prints")
"""


def test_json_stdout_holds_one_document_whatever_plugins_print(fake_site, capsys: pytest.CaptureFixture[str]) -> None:
    fake_site.add("loud", "gptzoo_fake_loud", PRINTING_PLUGIN)
    summary = run_json(capsys, "build", "gpt2-tiny", "--set", "model.activation=loud")
    assert summary["components"][1]["name"] == "loud"
    assert main(["build", "gpt2-tiny", "--set", "model.activation=loud"]) == 0  # without --json, stdout is theirs
    assert "a plugin printing in its factory" in capsys.readouterr().out
    message = run_error(capsys, "build", "gpt2-tiny", "--set", "model.activation=loud", "--seq-len", "999", "--json")
    assert message.endswith(
        "error: --seq-len 999 is longer than the 128 positions that LearnedPosition encodes; give at most 128"
    )


def test_flags_are_spelled_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "gpt2-tiny", "--js"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gptzoo build ")  # the command's usage, not gptzoo's
    assert err.endswith("gptzoo build: error: unrecognized arguments: --js; --js: did you mean --json?\n")
    assert main(["generate", "gpt2-tiny", "--prompt", "hi", "--max-tokens", "3"]) == 2
    assert capsys.readouterr().err.endswith(
        "gptzoo generate: error: unrecognized arguments: --max-tokens 3; --max-tokens: did you mean --max-new-tokens?\n"
    )
    assert main(["--json", "build", "gpt2-tiny"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "error": "gptzoo: unrecognized arguments: --json; --json goes after the command (gptzoo COMMAND --json ...)",
        "exit": 2,
    }


def test_control_characters_in_a_message_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "\x1b[2Jx\ny"]) == 2
    listing = did_you_mean("", list(gptzoo.recipe.shipped_recipes()))  # the first few, and how many more
    assert capsys.readouterr().err == f"error: \\x1b[2Jx\\ny: unknown recipe '\\x1b[2Jx\\ny'{listing}\n"
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert main(["build", "gpt2-tiny", "--out", f"{tmp_path}/file/\x1b[31m\nsub"]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write to {tmp_path}/file/\\x1b[31m\\nsub: {tmp_path}/file is a file, not a directory\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["build", "gpt2-tiny", "--batch", "1" + "0" * 300],
            "argument --batch: 100000000000000000000000000000... (301 ",
        ),
        (["build", "gpt2-tiny", "--seq-len", str(2**31)], "argument --seq-len: 2147483648 must be between 1 and"),
        (
            ["build", "gpt2-tiny", "--batch", "x" * 5000],
            "argument --batch: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (5000 cha",
        ),
    ],
)
def test_counts_beyond_int32_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines()[-1].startswith(f"gptzoo build: error: {message}")


def test_a_path_the_system_refuses_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long = "a" * 300
    assert run_error(capsys, "build", long) == f"error: {long}: cannot look at {long!r}: File name too long"
    assert run_error(capsys, "build", "gpt2-tiny", "--out", str(tmp_path / long)) == (
        f"error: cannot write to {tmp_path / long}: File name too long"
    )
    assert run_error(capsys, "generate", "--checkpoint", long, *GENERATE) == (  # any command: the CLI's last resort
        f"error: cannot use {long}: File name too long; check the path and its permissions"
    )


def test_the_out_directory_is_checked_before_the_model_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "taken").write_text("mine", encoding="utf-8")
    monkeypatch.setattr(gptzoo.GPT, "init_weights", raiser(AssertionError("the weights were initialized")))
    assert run_error(capsys, "build", "gpt2-tiny", "--out", str(tmp_path / "taken")) == (
        f"error: {tmp_path / 'taken'} already exists and is not an empty directory; choose another one or remove it"
    )
    assert (tmp_path / "taken").read_text(encoding="utf-8") == "mine"


def _stdout_into(target: str | int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gptzoo", *argv], stdout=target, stderr=subprocess.PIPE, text=True, timeout=120
    )


def test_stdout_that_cannot_be_written(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = _stdout_into(full, "build", "gpt2-tiny")
    assert (done.returncode, done.stderr) == (2, "error: cannot write the output: No space left on device\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptzoo", "build", "gpt2-xl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"gpt2-xl")
    proc.stdout.close()  # the reader goes away, as `| head -1` does
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, b"")


def test_model_text_reaches_stdout_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "a\tb [bold]c[/bold] :smile:"
    assert main(["generate", "shakespeare-bytes", "--prompt", prompt, "--max-new-tokens", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(prompt) and len(out.encode()) >= len(prompt.encode()) + 1

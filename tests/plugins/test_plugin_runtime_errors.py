"""A plugin component that fails while the model runs is a clean exit 2 in every command that runs a
model, naming the component, its plugin and what it raised; one that returns the wrong shape is
refused when it is built. gptzoo's own failures keep their traceback (they are gptzoo's bugs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_run import run_error
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main

BROKEN = """
import torch
from torch import nn

import gptzoo


class LongFails(nn.Module):
    '''RMSNorm that fails on sequences of more than 3 tokens.'''

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if x.shape[1] > 3:
            raise RuntimeError("no kernel for sequences longer than 3")
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Narrows(nn.Module):
    '''A norm that returns half the width.'''

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x[..., : x.shape[-1] // 2]


class Counts(nn.Module):
    '''A norm whose forward needs values: bincount has no meta kernel.'''

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        busy = torch.bincount((x.abs() > 1).long().flatten(), minlength=2)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) + 0 * busy[0]


@gptzoo.hookimpl
def register_norms(register):
    register("longfails", LongFails)
    register("narrows", Narrows)
    register("counts", Counts)
"""
PLUGIN = "gptzoo_fake_broken (gptzoo-fake-broken 1.0)"
FAILED = (
    f"error: norm 'longfails' from {PLUGIN} failed while the model ran: RuntimeError: no kernel for sequences longer "
    "than 3; fix the plugin, or choose another norm"
)
NARROWS = (
    f"error: norm 'narrows' from {PLUGIN} built a Narrows whose forward returned shape (1, 2, 32) for an input of "
    "shape (1, 2, 64); the model needs the input's shape; fix the plugin, or choose another norm"
)
BYTES = ["--set", "model.vocab_size=256", "--set", "tokenizer.name=bytes"]


def error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error of a command that must exit 2, after what it showed before it failed (a progress bar)."""
    message = run_error(capsys, *argv)
    return message[message.index("error: ") :]


@pytest.fixture
def broken(fake_site: FakeSite) -> FakeSite:
    fake_site.add("broken", "gptzoo_fake_broken", BROKEN)
    return fake_site


@pytest.fixture(scope="session")
def docs(stdlib_bytes: Path) -> Path:
    return stdlib_bytes


def test_generate_names_the_component_that_failed_while_the_model_ran(
    broken: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "gpt2-tiny", *BYTES, "--set", "model.norm=longfails", "--max-new-tokens", "2"]
    assert main([*argv, "--prompt", "hi"]) == 0  # short enough for it
    capsys.readouterr()
    assert main([*argv, "--prompt", "hello there"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "hello there"  # the prompt, streamed before the model ran
    assert captured.err.splitlines()[-1] == FAILED and "Traceback" not in captured.err
    assert main([*argv, "--prompt", "hello there", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == FAILED.removeprefix("error: ")


def test_train_names_it_and_leaves_nothing(
    broken: FakeSite, capsys: pytest.CaptureFixture[str], docs: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    argv = ["train", "gpt2-tiny", *BYTES, "--set", "model.norm=longfails", "--set", "train.max_steps=2"]
    assert error_line(capsys, *argv, "--set", "train.seq_len=8", "--data", str(docs), "--out", str(run)) == FAILED
    assert not run.exists()


def test_eval_names_it(broken: FakeSite, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe(
        "gpt2-tiny", ["model.vocab_size=256", "tokenizer.name=bytes", "model.norm=longfails"], registry=registry
    )
    gptzoo.save_checkpoint(gptzoo.build_model(recipe, registry=registry), recipe, tmp_path / "ck")
    text = tmp_path / "text.txt"
    text.write_text("hello world " * 20, encoding="utf-8")
    assert error_line(capsys, "eval", str(tmp_path / "ck"), "--text", str(text), "--lengths", "16") == FAILED


def test_a_norm_of_the_wrong_shape_is_refused_when_it_is_built(
    broken: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["build", "gpt2-tiny"], ["generate", "gpt2-tiny", "--prompt", "hi"]):
        assert error_line(capsys, *argv, "--set", "model.norm=narrows") == NARROWS


def test_gptzoo_own_failure_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from gptzoo.model import gpt

    def broken_forward(*args, **kwargs):
        raise RuntimeError("a bug of gptzoo's")

    monkeypatch.setattr(gpt.GPT, "forward", broken_forward)
    with pytest.raises(RuntimeError, match="a bug of gptzoo's"):
        main(["generate", "gpt2-tiny", "--prompt", "hi", "--max-new-tokens", "1"])


@pytest.mark.parametrize("jobs", [[], ["--jobs", "2"]], ids=["one-process", "workers"])
def test_sweep_names_it(
    broken: FakeSite, capsys: pytest.CaptureFixture[str], docs: Path, tmp_path: Path, jobs: list[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'base = "shakespeare-bytes"\nset = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.d_ff=64", '
        '"train.seq_len=8", "train.micro_batch_size=2", "train.eval_batches=1"]\nseeds = [0, 1]\n'
        f'[data]\npath = "{docs}"\n[budget]\nsteps = 2\n'
        '[[variants]]\nname = "broken"\nset = ["model.norm=longfails"]\n',
        encoding="utf-8",
    )
    assert error_line(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"), *jobs) == FAILED


def test_a_forward_that_cannot_run_on_the_meta_device_still_builds(
    broken: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    """build (and every load, which builds on the meta device first) probes a norm's shape with its
    forward; one that needs values (bincount) is probed where the model is built on a real device."""
    assert main(["build", "gpt2-tiny", "--set", "model.norm=counts", "--json"]) == 0
    components = json.loads(capsys.readouterr().out)["components"]
    assert [c["name"] for c in components if c["kind"] == "norm"] == ["counts"]
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", ["model.norm=counts"]))
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, model.recipe.model.vocab_size)

"""`gptzoo finetune` end to end on tiny checkpoints (Llama's and GPT-2's layouts, bytes tokenizer): the
adapter in peft's format, the run as a MODEL, a resume after SIGKILL that is bit-exact, the refusals
(exit 2, nothing written), and the adapter loaded by generate, compare-style checks and export --merge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json
from safetensors.torch import load_file

import gptzoo
from gptzoo.adapters.peft_format import split_adapter
from gptzoo.cli import main
from gptzoo.training.run_dir import others

TINY = ["--set", "tokenizer.name=bytes", "--set", "model.vocab_size=256", "--set", "model.n_layer=2"]
FAST = [
    "--set",
    "train.seq_len=32",
    "--set",
    "train.micro_batch_size=2",
    "--set",
    "train.eval_batches=2",
    "--set",
    "train.log_every=1",
    "--set",
    "train.peak_tflops=1.0",
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text data is tokenized into the cache: a test's own, not the user's."""
    monkeypatch.setenv("GPTZOO_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=["llama-tiny", "gpt2-tiny"])
def base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / request.param
    assert main(["build", request.param, *TINY, "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n\n".join(topics[k] for k in sorted(topics))[:60_000], encoding="utf-8")
    return path


def finetune(capsys: pytest.CaptureFixture[str], base: Path, text: Path, out: Path, *extra: str) -> dict:
    return run_json(capsys, "finetune", str(base), "--data", str(text), "--out", str(out), *FAST, *extra)


def test_finetune_lowers_the_eval_loss_and_writes_a_peft_adapter(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    steps = ["--set", "train.max_steps=30", "--set", "train.lr=0.01", "--targets", "q,v,down"]
    summary = finetune(capsys, base, text, tmp_path / "run", *steps)
    assert summary["steps"] == 30 and summary["val_loss"] < summary["val_loss_before"] - 0.1
    assert summary["targets"] == ["attn.q", "attn.v", "mlp.down"]
    r, d = 8, 64
    v_rows, d_ff = (64, 256) if "gpt2" in base.name else (32, 176)  # GPT-2's full heads; Llama's 2 KV heads, SwiGLU
    per_layer = r * (d + d) + r * (d + v_rows) + r * (d_ff + d)  # q, v, down: A (r, in) and B (out, r)
    assert summary["trainable_parameters"] == 2 * per_layer
    assert summary["optimizer_bytes"] == 8 * summary["trainable_parameters"]
    config = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16.0
    assert config["base_model_name_or_path"] == str(base.resolve())
    tensors = load_file(str(tmp_path / "run" / "adapter" / "adapter_model.safetensors"))
    prefix = "base_model.model.transformer.h.0." if "gpt2" in base.name else "base_model.model.model.layers.0."
    assert (
        prefix + ("attn.c_attn.lora_A.weight" if "gpt2" in base.name else "self_attn.q_proj.lora_A.weight") in tensors
    )
    checkpoint = load_file(str(tmp_path / "run" / "checkpoints" / "step-000030" / "model.safetensors"))
    assert all(".lora_" in key for key in checkpoint)  # the frozen base is not saved
    # the run is a MODEL: its base with its adapter, the same model as the base with --adapter
    run = run_json(capsys, "generate", str(tmp_path / "run"), "--prompt", "def ", "--max-new-tokens", "8")
    adapted = run_json(
        capsys,
        "generate",
        str(base),
        "--adapter",
        str(tmp_path / "run" / "adapter"),
        "--prompt",
        "def ",
        "--max-new-tokens",
        "8",
    )
    plain = run_json(capsys, "generate", str(base), "--prompt", "def ", "--max-new-tokens", "8")
    assert run["tokens"] == adapted["tokens"] != plain["tokens"]


KILLER = """
import os, signal, sys
from gptzoo.training import run_dir
from gptzoo.cli import main

save = run_dir.save


def killing_save(run, step, *args, **kwargs):
    path = save(run, step, *args, **kwargs)
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return path


run_dir.save = killing_save
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_a_run_killed_and_resumed_is_the_run_that_was_not(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path, dora: bool
) -> None:
    extra = [
        "--set",
        "train.max_steps=6",
        "--set",
        "train.checkpoint_every=2",
        "--lora-dropout",
        "0.1",
        *(["--dora"] if dora else []),
    ]
    whole = finetune(capsys, base, text, tmp_path / "whole", *extra)
    argv = ["finetune", str(base), "--data", str(text), "--out", str(tmp_path / "killed"), *FAST, *extra, "--json"]
    killed = subprocess.run([sys.executable, "-c", KILLER, *argv], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "killed" / "adapter").exists()
    resumed = run_json(capsys, "finetune", str(base), "--out", str(tmp_path / "killed"), "--resume", *FAST, *extra)
    assert resumed["loss"] == whole["loss"] and resumed["val_loss"] == whole["val_loss"]
    a = load_file(str(tmp_path / "whole" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_other_adapters_is_refused(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    finetune(capsys, base, text, tmp_path / "run", "--set", "train.max_steps=2")
    message = run_error(
        capsys, "finetune", str(base), "--out", str(tmp_path / "run"), "--resume", "--lora-rank", "4", *FAST
    )
    assert f"{tmp_path / 'run'} fine-tunes other adapters: rank 8 there, 4 here" in message
    message = run_error(capsys, "train", "llama-tiny", "--out", str(tmp_path / "run"), "--resume")
    assert f"{tmp_path / 'run'} is a fine-tuning run (adapters on a frozen base" in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lora-rank", "0"], "--lora-rank 0 must be at least 1"),
        (["--lora-rank", "65"], "--lora-rank 65 is above attn.q's size (64 x 64): a rank of at most 64 fits it"),
        (["--lora-alpha", "0"], "--lora-alpha 0.0 must be above 0"),
        (["--lora-dropout", "1"], "--lora-dropout 1.0 must be in [0, 1)"),
        (["--targets", "q,wq"], "--targets: 'wq' is not a target of this model; the model's targets are attn.q"),
        (["--set", "model.n_layer=1"], "--set model.n_layer=1: fine-tuning sets [train] keys only"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "run"
    error = run_error(capsys, "finetune", str(base), "--data", str(text), "--out", str(out), *args)
    assert message in error
    assert not out.exists()


def test_list_targets(capsys: pytest.CaptureFixture[str], base: Path) -> None:
    listed = run_json(capsys, "finetune", str(base), "--list-targets")["targets"]
    names = [t["target"] for t in listed]
    assert names[:4] == ["attn.q", "attn.k", "attn.v", "attn.o"] and names[-1] == "mlp.down"
    q = listed[0]
    assert (q["projection"], q["rows"], q["shape"], q["count"]) == ("attn.c_attn", [0, 64], [64, 64], 2)


def test_an_adapter_of_another_base_or_kind_is_refused_by_generate(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    finetune(capsys, base, text, tmp_path / "run", "--set", "train.max_steps=1", "--targets", "q")
    other = tmp_path / "wider"
    name = base.name
    assert main(["build", name, *TINY, "--set", "model.n_embd=32", "--set", "model.n_head=2", "--out", str(other)]) == 0
    capsys.readouterr()
    adapter = str(tmp_path / "run" / "adapter")
    message = run_error(capsys, "generate", str(other), "--adapter", adapter, "--prompt", "x")
    assert f"--adapter {adapter} was made for {str(base)!r} (its adapter_config.json's" in message  # by its name
    config = json.loads(Path(adapter, "adapter_config.json").read_text())
    Path(adapter, "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    message = run_error(capsys, "generate", str(other), "--adapter", adapter, "--prompt", "x")
    assert f"--adapter {adapter} does not fit this model (is it for another base model?" in message  # by its shapes
    Path(adapter, "adapter_config.json").write_text(json.dumps({**config, "peft_type": "PROMPT_TUNING"}))
    message = run_error(capsys, "generate", str(base), "--adapter", adapter, "--prompt", "x")
    assert "peft_type 'PROMPT_TUNING' is not supported; gptzoo applies LoRA adapters" in message


def test_export_merge_writes_the_adapted_weights(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    finetune(capsys, base, text, tmp_path / "run", "--set", "train.max_steps=3", "--set", "train.lr=0.01")
    adapter = str(tmp_path / "run" / "adapter")
    run_json(capsys, "export", str(base), "--adapter", adapter, "--merge", "--hf", str(tmp_path / "hf"))
    merged = gptzoo.load_model(hf=tmp_path / "hf").model.eval()
    unmerged = gptzoo.load_any(tmp_path / "run").model.eval()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), unmerged(ids), rtol=0, atol=1e-5)
    message = run_error(capsys, "export", str(base), "--adapter", adapter, "--hf", str(tmp_path / "hf2"))
    assert "--adapter DIR --merge writes the weights with the adapter merged into them: give both" in message


def test_an_adapter_made_for_another_named_base_is_refused(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    finetune(capsys, base, text, tmp_path / "run", "--set", "train.max_steps=1", "--targets", "q")
    adapter = tmp_path / "run" / "adapter"
    ask = ["generate", str(base), "--adapter", str(adapter), "--prompt", "x", "--max-new-tokens", "2"]
    assert main(ask) == 0  # finetune wrote this base's own directory
    capsys.readouterr()
    config = json.loads((adapter / "adapter_config.json").read_text())
    other = {**config, "base_model_name_or_path": "someone/another-model"}
    (adapter / "adapter_config.json").write_text(json.dumps(other))
    message = run_error(capsys, *ask)
    assert (
        f"--adapter {adapter} was made for 'someone/another-model' (its adapter_config.json's "
        f"base_model_name_or_path), not for this model ({base.name}); "  # the names it goes by: recipe, directory
    ) in message
    assert "set base_model_name_or_path to one of those names" in message
    for same in (f"org/{base.name.upper()}", "", None):  # a hub id of the same name; no name at all
        (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": same}))
        assert main(ask) == 0, same


def test_an_adapter_directory_with_an_equals_sign_is_a_directory(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    assert split_adapter("sql=runs/a=1/adapter") == ("sql", "runs/a=1/adapter")
    assert split_adapter("runs/a=1/adapter") == (None, "runs/a=1/adapter")
    assert split_adapter("=runs/adapter") == ("", "runs/adapter")
    finetune(capsys, base, text, tmp_path / "lr=2e-4", "--set", "train.max_steps=1", "--targets", "q")
    adapter = tmp_path / "lr=2e-4" / "adapter"
    for given in (str(adapter), f"mine={adapter}"):
        assert main(["generate", str(base), "--adapter", given, "--prompt", "x", "--max-new-tokens", "2"]) == 0, given


def test_a_fine_tune_interrupted_before_its_first_checkpoint_leaves_nothing_and_runs_again(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is kept (adapter.json included), so the same command simply runs again."""
    from gptzoo.training.trainer import Trainer

    out = tmp_path / "run"
    with monkeypatch.context() as patched:

        def interrupted(self: Trainer, *args: object, **kwargs: object) -> None:
            raise KeyboardInterrupt

        patched.setattr(Trainer, "run", interrupted)
        assert main(["finetune", str(base), "--data", str(text), "--out", str(out), *FAST]) == 130
    assert "no checkpoint had been written, so nothing was kept" in capsys.readouterr().err
    assert others(out) == []  # adapter.json too: it used to stay, and the same command was refused
    summary = finetune(capsys, base, text, out, "--set", "train.max_steps=1")
    assert summary["steps"] == 1


def test_a_fine_tune_its_adapter_format_cannot_describe_is_refused_before_training(
    capsys: pytest.CaptureFixture[str], text: Path, tmp_path: Path
) -> None:
    """ALiBi has no Hugging Face equivalent, so peft's format cannot hold its adapters: refused before the first
    step, with nothing written, not after training."""
    base = tmp_path / "alibi"
    assert main(["build", "gpt2-tiny", *TINY, "--set", "model.position=alibi", "--out", str(base), "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    message = run_error(capsys, "finetune", str(base), "--data", str(text), "--out", str(out), *FAST)
    assert message.startswith(
        f"error: {base}'s adapters cannot be written in peft's format, which a fine-tune ends by writing: recipe "
    ), message
    assert message.endswith("; fine-tune a model with a Hugging Face equivalent")
    assert not out.exists()


def test_a_run_is_resumed_and_used_from_another_working_directory(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adapter.json keeps the base directory as an absolute path, and a resume compares the directories, not the
    strings typed: `finetune ck` here and `finetune ../a/ck --resume` there are one run."""
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir(), there.mkdir()
    (here / "ck").symlink_to(base, target_is_directory=True)
    monkeypatch.chdir(here)
    steps = ["--set", "train.checkpoint_every=1"]
    run_json(capsys, "finetune", "ck", "--data", str(text), "--out", "run", *FAST, *steps, "--set", "train.max_steps=1")
    assert json.loads((here / "run" / "adapter.json").read_text())["base"] == str((here / "ck").resolve())
    monkeypatch.chdir(there)
    resumed = run_json(
        capsys, "finetune", "../a/ck", "--out", "../a/run", "--resume", *FAST, *steps, "--set", "train.max_steps=2"
    )
    assert resumed["steps"] == 2
    out = run_json(capsys, "generate", "../a/run", "--prompt", "x", "--max-new-tokens", "2")  # its base from here
    assert len(out["tokens"][0]) == 2 and out["finish_reasons"] == ["length"]


def test_the_validation_before_the_first_step_says_so(
    capsys: pytest.CaptureFixture[str], base: Path, text: Path, tmp_path: Path
) -> None:
    """A fine-tune first scores its starting weights (minutes, on a large model): a line says so before, then
    the loss; once a step is timed, the time left."""
    args = ["finetune", str(base), "--data", str(text), "--out", str(tmp_path / "run"), *FAST]
    assert main([*args, "--set", "train.max_steps=4"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = err.index("step 0: the validation loss of the starting weights, 2 batches of 2 x 32 tokens...")
    assert err[said + 1].startswith("step 0: val loss ")
    assert any(line.startswith("step 2 took ") for line in err[said + 2 :])

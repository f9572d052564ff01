"""`gptzoo train`, `gptzoo plot` and `gptzoo prepare` against hostile input: a second run into the same
directory, batches too large for memory, token ids beyond the vocabulary, corrupted checkpoints and
metrics, a full disk, read-only places, half-deleted checkpoints and Ctrl-C. Each ends in one message
and exit status 2 (130 for Ctrl-C), with nothing half-written."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest
import torch
from cli_run import run_error  # tests/ is on sys.path (pyproject: pythonpath)
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from test_train import TINY

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import GptzooError, Interrupted
from gptzoo.tokenizer import HFTokenizer, load_tokenizer
from gptzoo.training import data as data_mod
from gptzoo.training import run_dir
from gptzoo.training import trainer as train_mod
from gptzoo.training.data import prepare
from gptzoo.training.trainer import check_memory, memory_needed, train

STEPS = ["train.max_steps=4", "train.checkpoint_every=2", "train.eval_every=0"]
"""A run of 4 steps with checkpoints at steps 2 and 4."""


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "stdlib-docs"
    prepare("stdlib-docs", out, tokenizer="bytes")
    return out


@pytest.fixture(scope="module")
def trained(docs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of :data:`STEPS`; tests work on copies (see ``run``)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    train(recipe(*STEPS), out=out, data=docs)
    return out


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the finished run, to resume or to damage."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def recipe(*overrides: str) -> gptzoo.Recipe:
    return gptzoo.load_recipe("gpt2-tiny", [*TINY, *overrides])


def argv(out: Path, data: Path, *overrides: str, resume: bool = False) -> list[str]:
    """`gptzoo train gpt2-tiny` with TINY and ``overrides``, with --json (no progress bar on stderr)."""
    sets = [a for o in [*TINY, *overrides] for a in ("--set", o)]
    return [
        "train",
        "gpt2-tiny",
        *sets,
        "--data",
        str(data),
        "--out",
        str(out),
        *(["--resume"] if resume else []),
        "--json",
    ]


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def leftovers(run: Path) -> list[str]:
    """Temporary files and directories (and a lock) anywhere under ``run``."""
    return sorted(str(p.relative_to(run)) for p in run.rglob(".*"))


def stop_at(monkeypatch: pytest.MonkeyPatch, step: int, exc: BaseException) -> None:
    """Optimizer step ``step + 1`` raises ``exc`` before doing anything."""
    real = train_mod.Trainer.train_step

    def stopping(self: train_mod.Trainer) -> tuple[float, float, bool]:
        if self.step == step:
            raise exc
        return real(self)

    monkeypatch.setattr(train_mod.Trainer, "train_step", stopping)


# --- 1. one run per directory -----------------------------------------------------------------

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(run: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``run``'s lock, as a running `gptzoo train` does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run / run_dir.LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def in_use(run: Path, pid: int) -> str:
    return (
        f"error: {run} is in use by another `gptzoo train` (pid {pid} holds {run / '.lock'}); "
        f"wait for it to finish or stop it (kill {pid}), or choose another --out"
    )


def test_a_second_run_into_a_locked_directory_is_refused_naming_the_holder(
    run: Path, docs: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(run)
    assert run_error(capsys, *argv(run, docs, *STEPS)) == in_use(run, holder.pid)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == in_use(run, holder.pid)
    assert snapshot(run) == before  # the holder's pid is still in the lock file, nothing else changed


def test_a_lock_left_by_a_killed_run_is_stale(
    run: Path, docs: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (run / ".lock").read_text() == f"{holder.pid}\n"  # the file stays; the kernel dropped the lock
    assert main(argv(run, docs, "train.max_steps=6", resume=True)) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 6
    assert leftovers(run) == []  # the lock file went with the run that held it


def test_a_lock_without_a_pid(run: Path, docs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)  # held as a run on a full disk holds it: no pid written
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
            f"error: {run} is in use by another `gptzoo train` (it holds {run / '.lock'}); wait for it to finish or "
            "stop it, or choose another --out"
        )
    finally:
        os.close(fd)


def test_the_lock_is_held_for_the_whole_run_with_its_pid(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, seen = tmp_path / "run", []
    real = train_mod.Trainer.train_step

    def probing(self: train_mod.Trainer) -> tuple[float, float, bool]:
        fd = os.open(out / ".lock", os.O_RDONLY)  # another open file description, as another process has
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(os.pread(fd, 32, 0).decode())
        finally:
            os.close(fd)
        with pytest.raises(GptzooError, match=f"^{out} is in use by another `gptzoo train` \\(pid {os.getpid()} "):
            train(recipe(*STEPS), out=out, data=docs, resume=True)
        return real(self)

    monkeypatch.setattr(train_mod.Trainer, "train_step", probing)
    train(recipe(*STEPS), out=out, data=docs)
    assert seen == [f"{os.getpid()}\n"] * 4 and leftovers(out) == []


LOCKS: dict[str, tuple[Callable[[Path, Path], Any], str]] = {
    "symlink": (lambda lock, victim: lock.symlink_to(victim), "a symbolic link"),
    "dangling symlink": (lambda lock, victim: lock.symlink_to(victim.with_name("created")), "a symbolic link"),
    "hard link": (
        lambda lock, victim: os.link(victim, lock),
        "a file with 2 hard links (its contents live under another name too)",
    ),
    "directory": (lambda lock, victim: lock.mkdir(), "a directory"),
    "fifo": (lambda lock, victim: os.mkfifo(lock), "a named pipe (FIFO)"),
    "text": (lambda lock, victim: lock.write_text("my notes\n"), "a file holding something other than a process id"),
}
"""A RUN/.lock that is not a lock file gptzoo made (how to make one, and what the message calls it)."""


@pytest.mark.parametrize("kind", LOCKS)
def test_a_lock_that_is_not_a_lock_file_gptzoo_made_is_refused_unwritten(
    run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A run directory received from elsewhere: its .lock is neither followed nor written, for a resume as for a
    new run (whose emptiness check passes over the lock)."""
    make, what = LOCKS[kind]
    (tmp_path / "new").mkdir()
    for out, resume in ((run, True), (tmp_path / "new", False)):
        victim = tmp_path / f"victim-{out.name}.txt"
        victim.write_text("precious")
        make(out / ".lock", victim)
        before = snapshot(out)
        assert run_error(capsys, *argv(out, docs, "train.max_steps=6", resume=resume)) == (
            f"error: {out / '.lock'} is not a lock file gptzoo made: it is {what}; move it away, or choose another "
            "--out"
        )
        assert victim.read_text() == "precious" and snapshot(out) == before and os.path.lexists(out / ".lock")
    assert not (tmp_path / "created").exists()  # O_CREAT did not follow the dangling link


# --- 2. memory ----------------------------------------------------------------------------------


def test_a_micro_batch_too_large_for_memory_is_refused_before_allocating(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train_mod, "available_bytes", lambda device: 8 * 2**30)
    n_params = sum(p.numel() for p in gptzoo.build_model(recipe()).parameters())
    tokens = 10**9 * 64
    logits = tokens * 256 * 4
    need = 16 * n_params + 3 * logits + tokens * 2 * 17 * 64 * 4  # 2 layers of width 64, float32
    assert run_error(capsys, *argv(tmp_path / "run", docs, "train.micro_batch_size=1000000000")) == (
        f"error: train.micro_batch_size=1000000000 x seq_len=64 needs about {need / 2**40:.2f} TiB of memory to "
        f"train (the float32 logits alone take {logits / 2**40:.2f} TiB), but 8.00 GiB is available; lower "
        "train.micro_batch_size (raising train.grad_accum keeps the batch) or train.seq_len"
    )
    wide = ["model.n_embd=32768", "model.n_head=4"]
    n_params = sum(p.numel() for p in gptzoo.build_model(recipe(*wide), device="meta").parameters())
    assert n_params == 8_636_727_808
    assert run_error(capsys, *argv(tmp_path / "run", docs, *wide)) == (
        "error: the model's 8,636,727,808 parameters need 128.70 GiB for their weights, gradients and AdamW state, "
        "but 8.00 GiB of memory is available; train a smaller model (model.n_layer, model.n_embd)"
    )
    assert not (tmp_path / "run").exists()


def test_the_memory_estimate_passes_the_quickstart_and_the_tests() -> None:
    quickstart = gptzoo.load_recipe("shakespeare-bytes")
    n_params = sum(p.numel() for p in gptzoo.build_model(quickstart).parameters())
    need, logits = memory_needed(quickstart, n_params)
    assert logits == 8 * 256 * 256 * 4 and need == 16 * n_params + 3 * logits + 8 * 256 * 4 * 17 * 128 * 4
    assert need < 100 * 2**20  # about 0.1 GiB
    for spec in (quickstart, recipe(), recipe("train.micro_batch_size=64", "train.seq_len=128")):
        check_memory(spec, torch.device("cpu"))  # on this machine's real available memory


# --- 3. token ids beyond the vocabulary -----------------------------------------------------------


def damaged_copy(docs: Path, tmp_path: Path, **meta: Any) -> Path:
    out = Path(shutil.copytree(docs, tmp_path / "data"))
    if meta:
        (out / "meta.json").write_text(json.dumps({**json.loads((out / "meta.json").read_text()), **meta}))
    return out


def test_token_ids_beyond_the_vocabulary_are_refused_before_the_first_step(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = damaged_copy(docs, tmp_path)
    tokens = np.fromfile(data / "train.bin", dtype="<u2")
    tokens[1234] = 300
    tokens.tofile(data / "train.bin")
    out = tmp_path / "run"
    assert run_error(capsys, *argv(out, data, *STEPS)) == (
        f"error: {data}: train.bin holds token id 300, but the model's vocab_size is 256 (ids 0..255); "
        "the data is damaged or made for another tokenizer: prepare it again"
    )
    assert run_error(capsys, *argv(out, data, *STEPS, "model.vocab_size=512")) == (
        f"error: {data}: train.bin holds token id 300, beyond meta.json's vocab_size 256; "
        "the data is damaged: prepare it again"
    )
    data = damaged_copy(docs, tmp_path / "b", vocab_size=1000)
    assert run_error(capsys, *argv(out, data, *STEPS)) == (
        f"error: {data} was prepared for a vocabulary of 1000 tokens (meta.json vocab_size), but the model's "
        "vocab_size is 256; use a recipe with vocab_size >= 1000 or prepare the data with the recipe's tokenizer"
    )
    assert not out.exists()


def test_data_of_a_tokenizer_of_the_same_name_but_another_vocabulary(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """meta.json records the sha256 of the tokenizer's vocabulary; data from before it did still trains."""
    ours = data_mod.vocab_sha256(load_tokenizer("bytes"))
    assert json.loads((docs / "meta.json").read_text())["tokenizer"] == {"name": "bytes", "vocab_sha256": ours}
    data = damaged_copy(docs, tmp_path, tokenizer={"name": "bytes", "vocab_sha256": "0" * 64})
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data} was prepared with the tokenizer 'bytes', whose vocabulary differs from that of the tokenizer "
        f"'bytes' the model uses (vocab_sha256 000000000000... in meta.json, {ours[:12]}... here): the same ids are "
        "other tokens; run `gptzoo prepare ... --tokenizer bytes` for it"
    )
    old = damaged_copy(docs, tmp_path / "old", tokenizer={"name": "bytes"})
    assert main(argv(tmp_path / "run", old, *STEPS)) == 0


WORDS = [f"w{i}" for i in range(255)]


def hf_model_dir(path: Path, order: list[str]) -> Path:
    """A tiny GPT-2 Hugging Face checkpoint whose tokenizer gives id 1 + i to the word order[i] (0 is unknown)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128, bos_token_id=None, eos_token_id=None
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: 1 + i for i, w in enumerate(order)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return path


def test_data_of_another_hugging_face_tokenizer_of_the_same_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both are "hf" with 256 tokens: the vocabularies tell them apart. The advice for the wrong tokenizer
    works, with the directory the weights come from or without one."""
    mine, theirs = hf_model_dir(tmp_path / "mine", WORDS), hf_model_dir(tmp_path / "theirs", WORDS[::-1])
    capsys.readouterr()  # transformers' progress bars
    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(WORDS[i % 97 * 2 % 255] for i in range(3000)))
    prepare(str(corpus), tmp_path / "data", tokenizer=str(theirs))
    data, hf = tmp_path / "data", ["tokenizer.name=hf", "train.max_steps=1", "train.eval_every=0"]
    a = data_mod.vocab_sha256(HFTokenizer.from_dir(mine))
    b = json.loads((data / "meta.json").read_text())["tokenizer"]["vocab_sha256"]
    init = ["--init-from-hf", str(mine)]
    assert run_error(capsys, *argv(tmp_path / "run", data, *hf), *init) == (
        f"error: {data} was prepared with the tokenizer of {theirs}, whose vocabulary differs from that of the "
        f"tokenizer of {mine} the model uses (vocab_sha256 {b[:12]}... in meta.json, {a[:12]}... here): the same ids "
        f"are other tokens; run `gptzoo prepare ... --tokenizer {mine}` for it"
    )
    docs = damaged_copy(data, tmp_path / "bytes", tokenizer={"name": "bytes"})
    assert run_error(capsys, *argv(tmp_path / "run", docs, *hf), *init) == (
        f"error: {docs} was prepared with the 'bytes' tokenizer, but recipe 'gpt2-tiny' uses 'hf'; run `gptzoo "
        f"prepare ... --tokenizer {mine}` for it"
    )
    assert run_error(capsys, *argv(tmp_path / "run", docs, *hf)) == (
        f"error: {docs} was prepared with the 'bytes' tokenizer, but recipe 'gpt2-tiny' uses 'hf'; its 'hf' tokenizer "
        "is the one of the Hugging Face weights it starts from: run `gptzoo prepare ... --tokenizer DIR` with their "
        "directory DIR, and train with --init-from-hf DIR"
    )
    smollm2 = gptzoo.load_recipe("smollm2-135m")  # its [weights] hf is a name prepare takes
    with pytest.raises(GptzooError) as exc:
        train(smollm2, out=tmp_path / "run", data=docs)
    assert str(exc.value) == (
        f"{docs} was prepared with the 'bytes' tokenizer, but recipe 'smollm2-135m' uses 'hf'; run `gptzoo prepare "
        "... --tokenizer smollm2-135m` for it"
    )
    assert not (tmp_path / "run").exists()
    assert main(["prepare", str(corpus), "--tokenizer", str(mine), "--out", str(tmp_path / "ours")]) == 0
    assert main([*argv(tmp_path / "run", tmp_path / "ours", *hf), *init]) == 0
    capsys.readouterr()


# --- 4. a corrupted train_state.pt --------------------------------------------------------------


def corrupt(path: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Replace the training state at ``path`` with ``change(state)``."""
    torch.save(change(torch.load(path, weights_only=True)), path)


def without(state: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != key}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: {**s, "step": "4"}, "step is '4', expected 4, the step in its directory's name"),
        (lambda s: {**s, "step": -1}, "step is -1, expected 4, the step in its directory's name"),
        (lambda s: without(s, "step"), "step is missing, expected 4, the step in its directory's name"),
        (lambda s: {**s, "skipped": 9}, "skipped is 9, expected 0 to 4"),
        (lambda s: {**s, "windows_seen": 1.5}, "windows_seen is 1.5, expected a whole number >= 0"),
        (
            lambda s: {**s, "world_size": "1"},
            "world_size is '1', expected a whole number >= 1 (the processes that trained it)",
        ),
        (
            lambda s: {**s, "world_size": True},
            "world_size is True, expected a whole number >= 1 (the processes that trained it)",
        ),
        (
            lambda s: {**s, "optimizer": {}},
            "optimizer.state is missing, expected a dict of each parameter's AdamW moments",
        ),
        (
            lambda s: {**s, "optimizer": []},
            "optimizer is [], expected AdamW's state (a dict of 'state' and 'param_groups')",
        ),
        (
            lambda s: {**s, "optimizer": {**s["optimizer"], "param_groups": []}},
            "optimizer.param_groups is [], expected a non-empty list of parameter groups",
        ),
        (
            lambda s: {**s, "rng": {"cpu": torch.zeros(12, dtype=torch.uint8)}},
            "rng.cpu is a uint8 tensor of shape (12,), expected a uint8 tensor of shape (5056,)",
        ),
        (
            lambda s: {**s, "rng": {"cpu": torch.zeros(5056)}},
            "rng.cpu is a float32 tensor of shape (5056,), expected a uint8 tensor of shape (5056,)",
        ),
        (lambda s: {**s, "rng": None}, "rng is None, expected a dict of random number generator states"),
        (
            lambda s: {**s, "scaler": {"scale": "big"}},
            "scaler is a dict with keys ['scale'], expected the float16 loss scaler's state "
            "(a dict of numbers; empty in other precisions)",
        ),
        (lambda s: [1, 2], "it holds [1, 2], expected a dict of training state"),
    ],
)
def test_a_corrupted_train_state_names_the_file_and_the_field(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str], change: Callable[[dict[str, Any]], Any], problem: str
) -> None:
    checkpoint = run / "checkpoints" / "step-000004"
    corrupt(checkpoint / "train_state.pt", change)
    before = snapshot(run)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", "train.checkpoint_every=2", resume=True)) == (
        f"error: {checkpoint / 'train_state.pt'} is corrupt: {problem}; move {checkpoint} away to resume from an "
        "earlier checkpoint, or start a new --out"
    )
    assert snapshot(run) == before and leftovers(run) == []


def each_group(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change of the training state that applies ``change`` to every AdamW parameter group."""

    def changed(state: dict[str, Any]) -> dict[str, Any]:
        for group in state["optimizer"]["param_groups"]:
            change(group)
        return state

    return changed


def each_param(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change of the training state that applies ``change`` to every parameter's AdamW state."""

    def changed(state: dict[str, Any]) -> dict[str, Any]:
        for moments in state["optimizer"]["state"].values():
            change(moments)
        return state

    return changed


C_ATTN = "optimizer.state['blocks.0.attn.c_attn.weight']"
"""The first parameter's AdamW state, as messages name it."""


def test_a_resume_with_another_model_names_the_keys_that_differ(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = run / "checkpoints" / "step-000004"
    changed = ["model.attention=eager", "model.norm={name='rmsnorm', eps=1e-6}", "model.n_kv_head=2"]
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", *changed, resume=True)) == (
        f"error: {checkpoint} is a checkpoint of a different recipe: [model] norm is {{'name': 'layernorm', 'eps': "
        "1e-05} there, {'name': 'rmsnorm', 'eps': 1e-06} here; [model] attention is 'causal' there, 'eager' here; "
        f"[model] n_kv_head is unset there, 2 here; resume with the run's own recipe ({run / 'recipe.toml'}) or start "
        "a new --out"
    )
    with pytest.raises(GptzooError) as exc:  # the data says it first, through the command line
        train_mod.check_resumable(recipe("tokenizer.name=gpt2"), recipe(), checkpoint)
    assert str(exc.value).startswith(
        f"{checkpoint} is a checkpoint of a different recipe: [tokenizer] name is 'bytes' there, 'gpt2' here; "
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (each_group(lambda g: g.update(amsgrad=True)), "optimizer.param_groups[0].amsgrad is True, expected False"),
        (each_group(lambda g: g.update(maximize=True)), "optimizer.param_groups[0].maximize is True, expected False"),
        (
            each_group(lambda g: g.update(differentiable=True)),
            "optimizer.param_groups[0].differentiable is True, expected False",
        ),
        (
            each_group(lambda g: g.update(eps="e")),
            "optimizer.param_groups[0].eps is 'e', expected 1e-08 (the recipe's eps)",
        ),
        (
            each_group(lambda g: g.update(betas=(5.0, 7.0))),
            "optimizer.param_groups[0].betas is (5.0, 7.0), expected (0.9, 0.95) (the recipe's beta1, beta2)",
        ),
        (
            each_group(lambda g: g.update(weight_decay=-1e30)),
            "optimizer.param_groups[0].weight_decay is -1e+30, expected 0.1",
        ),
        (
            each_group(lambda g: g.update(lr="fast")),
            "optimizer.param_groups[0].lr is 'fast', expected a finite number >= 0",
        ),
        (
            each_group(lambda g: g.update(fused="yes")),
            "optimizer.param_groups[0].fused is 'yes', expected True, False or None",
        ),
        (each_group(lambda g: g.pop("betas")), "optimizer.param_groups[0].betas is missing, expected (0.9, 0.95)"),
        (
            each_group(lambda g: g.update(nesterov=True)),
            "optimizer.param_groups[0] holds 'nesterov', which gptzoo's AdamW does not have",
        ),
        (
            each_param(lambda m: m.update(step=torch.tensor([1.0, 2.0]))),
            f"{C_ATTN}.step is a float32 tensor of shape (2,), expected a scalar float tensor: the updates applied, "
            "1 to 4",
        ),
        (
            each_param(lambda m: m.update(step=torch.tensor(-1.0))),
            f"{C_ATTN}.step is a float32 scalar tensor (-1.0), expected a scalar float tensor: the updates applied, "
            "1 to 4",
        ),
        (
            each_param(lambda m: m.pop("step")),
            f"{C_ATTN} holds ['exp_avg', 'exp_avg_sq'], expected exactly ['exp_avg', 'exp_avg_sq', 'step']",
        ),
        (
            each_param(lambda m: m.update(max_exp_avg_sq=m["exp_avg_sq"])),
            f"{C_ATTN} holds ['exp_avg', 'exp_avg_sq', 'max_exp_avg_sq', 'step'], expected exactly ['exp_avg', "
            "'exp_avg_sq', 'step']",
        ),
        (
            each_param(lambda m: m.update(exp_avg=m["exp_avg"].double())),
            f"{C_ATTN}.exp_avg is a float64 tensor of shape (192, 64), expected a float32 tensor of shape (192, 64)",
        ),
        (
            each_param(lambda m: m.update(exp_avg_sq=m["exp_avg_sq"].long())),
            f"{C_ATTN}.exp_avg_sq is an int64 tensor of shape (192, 64), expected a float32 tensor of shape (192, 64)",
        ),
        (
            each_param(lambda m: m["exp_avg_sq"].fill_(float("nan"))),
            f"{C_ATTN}.exp_avg_sq holds non-finite values, expected finite ones",
        ),
        (
            each_param(lambda m: m["exp_avg_sq"].fill_(-1.0)),
            f"{C_ATTN}.exp_avg_sq holds negative values, expected squares (>= 0)",
        ),
        (
            lambda s: {**s, "optimizer": {**s["optimizer"], "state": {}}},
            "optimizer.state is empty, expected the moments of the parameters 4 step(s) updated",
        ),
        (
            lambda s: {**s, "optimizer": {**s["optimizer"], "state": {0: {}}}},
            "optimizer.state holds 0, which is not a parameter of this model",
        ),
        (
            lambda s: {**s, "skipped": 4},
            "optimizer.state holds the moments of 'blocks.0.attn.c_attn.weight', expected none: no update was applied "
            "(skipped is the step: every step was skipped)",
        ),
    ],
)
def test_a_tampered_optimizer_state_is_refused_field_by_field(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str], change: Callable[[dict[str, Any]], Any], problem: str
) -> None:
    """Before the first optimizer step, and before anything on disk changes (metrics.jsonl's junk line stays)."""
    checkpoint = run / "checkpoints" / "step-000004"
    corrupt(checkpoint / "train_state.pt", change)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("junk a resume would remove\n")
    before = snapshot(run)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: {checkpoint / 'train_state.pt'} is corrupt: {problem}; move {checkpoint} away to resume from an "
        "earlier checkpoint, or start a new --out"
    )
    assert snapshot(run) == before and leftovers(run) == []


def test_a_resumed_optimizer_takes_its_hyper_parameters_from_the_recipe(
    trained: Path, run: Path, docs: Path, tmp_path: Path
) -> None:
    """What the file may say about how torch runs the step (foreach, fused) or the last lr is not used."""
    clean = Path(shutil.copytree(trained, tmp_path / "clean"))
    corrupt(
        run / "checkpoints" / "step-000004" / "train_state.pt",
        each_group(lambda g: g.update(lr=123.0, foreach=True, fused=None)),
    )
    for out in (clean, run):
        train(
            recipe("train.max_steps=6", "train.checkpoint_every=2", "train.eval_every=0"),
            out=out,
            data=docs,
            resume=True,
        )

    def logged(out: Path) -> list[tuple[Any, ...]]:
        return [
            tuple(r.get(k) for k in ("step", "loss", "lr", "grad_norm", "val_loss")) for r in run_dir.read_metrics(out)
        ]

    assert logged(run) == logged(clean)  # the same losses, learning rates and gradient norms, bit for bit
    groups = [run_dir.load(out / "checkpoints" / "step-000006")[1]["optimizer"]["param_groups"] for out in (clean, run)]
    assert groups[0] == groups[1]  # and the same optimizer, saved again


def test_the_advice_for_a_corrupted_checkpoint_works(run: Path, docs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = run / "checkpoints" / "step-000004"
    (checkpoint / "train_state.pt").write_bytes(b"\x80\x02half")  # torn
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: cannot read the checkpoint {checkpoint / 'train_state.pt'} (KeyError: 97): it is damaged or cut "
        f"short; move {checkpoint} away to resume from an earlier checkpoint, or start a new --out"
    )
    shutil.move(checkpoint, run.parent / "step-000004.bad")
    assert main(argv(run, docs, "train.max_steps=6", "train.checkpoint_every=2", resume=True)) == 0
    assert [s for s, _ in run_dir.checkpoint_dirs(run)] == [4, 6]


class Runs:
    """An object whose unpickling would run a command: weights_only refuses it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_train_state_that_is_a_malicious_pickle_empty_or_cut_short(
    trained: Path, run: Path, docs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(run)
    checkpoint = run / "checkpoints" / "step-000004"
    state, advice = checkpoint / "train_state.pt", f"move {checkpoint} away to resume from an earlier checkpoint"
    resume = argv(run, docs, "train.max_steps=6", resume=True)
    torch.save({"step": 4, "x": Runs()}, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about the pickle protocol: the message says it all
        assert run_error(capsys, *resume) == (
            f"error: {state} holds objects gptzoo refuses to unpickle (Trying to load unsupported GLOBAL posix.system "
            f"whose module posix is blocked); nothing in it ran; {advice}, or start a new --out"
        )
        state.write_bytes(pickle.dumps(Runs(), protocol=4))
        assert run_error(capsys, *resume) == (
            f"error: {state} holds objects gptzoo refuses to unpickle (Unsupported operand 149); nothing in it ran; "
            f"{advice}, or start a new --out"
        )
    assert not (run / "pwned").exists()
    state.write_bytes(b"")
    assert run_error(capsys, *resume) == (
        f"error: {state} is empty: its save was cut short; {advice}, or start a new --out"
    )
    state.write_bytes((trained / "checkpoints" / "step-000004" / "train_state.pt").read_bytes()[:-200])
    assert run_error(capsys, *resume) == (
        f"error: cannot read the checkpoint {state} (RuntimeError: PytorchStreamReader failed reading zip archive: "
        f"failed finding central directory): it is damaged or cut short; {advice}, or start a new --out"
    )


def test_optimizer_state_and_weights_that_do_not_fit_the_model(
    trained: Path, run: Path, docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = run / "checkpoints" / "step-000004"
    advice = f"move {checkpoint} away to resume from an earlier checkpoint, or start a new --out"
    resume = argv(run, docs, "train.max_steps=6", resume=True)
    state = torch.load(checkpoint / "train_state.pt", weights_only=True)
    state["optimizer"]["state"]["wte.weight"]["exp_avg"] = torch.zeros(3)
    torch.save(state, checkpoint / "train_state.pt")
    assert run_error(capsys, *resume) == (
        f"error: {checkpoint / 'train_state.pt'} is corrupt: optimizer.state['wte.weight'].exp_avg is a float32 "
        f"tensor of shape (3,), expected a float32 tensor of shape (256, 64); {advice}"
    )
    state = torch.load(checkpoint / "train_state.pt", weights_only=True)
    state["optimizer"]["param_groups"].pop()
    torch.save(state, checkpoint / "train_state.pt")
    assert run_error(capsys, *resume) == (
        f"error: {checkpoint / 'train_state.pt'} is corrupt: optimizer.param_groups hold [8] parameters, expected "
        f"this model's [8, 20]; {advice}"
    )
    shutil.copy(trained / "checkpoints" / "step-000004" / "train_state.pt", checkpoint)
    tensors = load_file(checkpoint / "model.safetensors")
    save_file({**tensors, "wte.weight": torch.zeros(7, 64)}, checkpoint / "model.safetensors")
    assert run_error(capsys, *resume) == (
        f"error: the checkpoint {checkpoint} cannot be resumed: model.safetensors: wte.weight is torch.float32 "
        f"(7, 64), the model's is torch.float32 (256, 64); {advice}"
    )
    save_file({k: v for k, v in tensors.items() if k != "wte.weight"}, checkpoint / "model.safetensors")
    assert run_error(capsys, *resume) == (
        f"error: the checkpoint {checkpoint} cannot be resumed: model.safetensors lacks ['wte.weight'] and has "
        f"unexpected []; {advice}"
    )
    (checkpoint / "recipe.toml").unlink()
    assert run_error(capsys, *resume) == (
        f"error: the checkpoint {checkpoint} cannot be resumed: {checkpoint / 'recipe.toml'}: cannot read: "
        f"No such file or directory; {advice}"
    )


# --- 5. metrics lines that are JSON but not records ---------------------------------------------

JUNK = [b"[1, 2]", b"3", b'"text"', b"null", b'{"step": "x", "loss": 1.0}', b'{"step": 3, "loss": "low"}', b"\xff\xfe"]


def test_metrics_lines_that_are_not_records_are_skipped_by_plot_and_resume(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = run / "metrics.jsonl"
    good = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_bytes(metrics.read_bytes() + b"\n".join(JUNK) + b"\n")
    assert run_dir.read_metrics(run) == good
    assert main(["plot", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"png": str(run / "loss.png")}
    assert main(argv(run, docs, "train.max_steps=6", resume=True)) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 6
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # the junk is gone: every line parses
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if "val_loss" in r] == [4, 6]
    (run / "metrics.jsonl").write_bytes(b"\n".join(JUNK))
    assert run_error(capsys, "plot", str(run)) == (
        f"error: {run / 'metrics.jsonl'} has no losses to plot; is {run} a `gptzoo train --out` directory?"
    )


BIG = "9" * 400
UNUSABLE = [
    b"[" * 100_000,  # nested too deeply for json (a RecursionError)
    f'{{"step": 3, "loss": {BIG}}}'.encode(),  # an integer no float holds: matplotlib overflows
    f'{{"step": {BIG}, "loss": 1.0}}'.encode(),
    b'{"step": 3, "loss": 1e400}',  # json reads it as inf
    b'{"step": 3, "loss": NaN}',  # not JSON, though Python's json reads it
    b'{"step": 3, "loss": 1.0, "lr": Infinity}',
    b'{"step": 3, "loss": 1e39}',  # beyond float32, which losses are computed in
    b'{"step": 3, "loss": 1.0, "nested": [[[1]]]}',  # records are flat
]


def test_metrics_lines_with_unusable_numbers_or_nesting_are_skipped(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = run / "metrics.jsonl"
    good = run_dir.read_metrics(run)
    metrics.write_bytes(metrics.read_bytes() + b"\n".join(UNUSABLE) + b"\n")
    assert run_dir.read_metrics(run) == good
    assert main(["plot", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"png": str(run / "loss.png")}
    assert main(argv(run, docs, "train.max_steps=6", resume=True)) == 0
    capsys.readouterr()

    def strict(constant: str) -> None:
        raise AssertionError(f"{constant} in metrics.jsonl")

    records = [json.loads(line, parse_constant=strict) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_meta_json_nested_too_deeply(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = damaged_copy(docs, tmp_path)
    (data / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data / 'meta.json'} is corrupt (its JSON is nested too deeply to read); run `gptzoo prepare SOURCE "
        "--out DIR` again into a new DIR"
    )


# --- 6. a full disk -----------------------------------------------------------------------------


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, real_save, saves = tmp_path / "run", torch.save, []

    def full(obj: object, f: BinaryIO) -> None:
        saves.append(f)
        if len(saves) == 2:
            f.write(b"\x80\x02half")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(run_dir.torch, "save", full)
    assert run_error(capsys, *argv(out, docs, *STEPS)) == (
        f"error: cannot write {out / 'checkpoints' / 'step-000004' / 'train_state.pt'}: the disk is full (No space "
        f"left on device); nothing of step 4 was saved; the previous checkpoint {out / 'checkpoints' / 'step-000002'} "
        "is intact (resume with --resume once this is fixed)"
    )
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"] and leftovers(out) == []
    monkeypatch.setattr(run_dir.torch, "save", real_save)
    assert main(argv(out, docs, *STEPS, resume=True)) == 0


def test_a_full_disk_while_writing_the_weights_or_the_first_checkpoint(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(run_dir, "write_files", full)
    out = tmp_path / "run"
    assert run_error(capsys, *argv(out, docs, *STEPS)) == (
        f"error: cannot write {out / 'checkpoints' / 'step-000002' / 'model.safetensors'}: the disk is full (No space "
        "left on device); nothing of step 2 was saved; no checkpoint had been written, so nothing was kept (train "
        "again once this is fixed)"
    )
    assert not out.exists()  # a new run with no checkpoint leaves nothing: the same command runs again
    monkeypatch.undo()
    assert main(argv(out, docs, *STEPS)) == 0


def test_a_full_disk_while_appending_metrics(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: cannot append to {run / 'metrics.jsonl'}: the disk is full (No space left on device); the previous "
        f"checkpoint {run / 'checkpoints' / 'step-000004'} is intact (resume with --resume once this is fixed)"
    )
    assert leftovers(run) == []


# --- 7. read-only places ------------------------------------------------------------------------


def test_a_run_directory_that_cannot_be_written(
    run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open, real_mkdir = os.open, Path.mkdir

    def denied_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(run)):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    def denied_mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == tmp_path / "new":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied_open)
    monkeypatch.setattr(Path, "mkdir", denied_mkdir)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: cannot write {run / '.lock'}: Permission denied; choose another --out"
    )
    assert run_error(capsys, *argv(tmp_path / "new", docs, *STEPS)) == (
        f"error: cannot create the run directory {tmp_path / 'new'}: Permission denied; choose another --out"
    )


UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
"""Root writes into read-only directories: without these two capabilities it is refused as anyone is."""


@pytest.mark.skipif(bool(UNPRIVILEGED) and shutil.which("setpriv") is None, reason="root, and no setpriv")
def test_a_read_only_run_directory(run: Path, docs: Path) -> None:
    def refused(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [*UNPRIVILEGED, sys.executable, "-m", "gptzoo", *args], capture_output=True, text=True, timeout=300
        )
        return done.returncode, done.stderr

    run.chmod(0o555)
    try:
        assert refused(*argv(run, docs, "train.max_steps=6", resume=True)[:-1]) == (
            2,
            f"error: cannot write {run / '.lock'}: Permission denied; choose another --out\n",
        )
        assert refused("plot", str(run)) == (
            2,
            f"error: cannot write {run / 'loss.png'}: Permission denied; give --out FILE in a writable place\n",
        )
    finally:
        run.chmod(0o755)


def test_plot_into_a_place_that_cannot_be_written(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    def denied(self: Figure, fname: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(fname))

    monkeypatch.setattr(Figure, "savefig", denied)
    assert run_error(capsys, "plot", str(run)) == (
        f"error: cannot write {run / 'loss.png'}: Permission denied; give --out FILE in a writable place"
    )
    monkeypatch.undo()
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "nowhere" / "x.png")) == (
        f"error: cannot write {tmp_path / 'nowhere' / 'x.png'}: No such file or directory; give another --out FILE"
    )
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path)) == (
        f"error: --out {tmp_path} is a directory; give a file name such as {tmp_path / 'loss.png'}"
    )
    assert run_error(capsys, "plot", str(tmp_path / "nope")) == (
        f"error: no run directory at {tmp_path / 'nope'}; give a `gptzoo train --out` directory"
    )
    assert leftovers(run) == [] and not (run / "loss.png").exists()


def test_plot_out_under_a_file_or_a_loop_or_over_a_file_that_is_not_a_plot(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("mine")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "file" / "x.png")) == (
        f"error: cannot write {tmp_path / 'file' / 'x.png'}: {tmp_path / 'file'} is a file, not a directory; give "
        "another --out FILE"
    )
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "loop" / "x.png")) == (
        f"error: cannot write {tmp_path / 'loop' / 'x.png'}: Too many levels of symbolic links; give another --out FILE"
    )
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "file")) == (
        f"error: {tmp_path / 'file'} already exists and is not a previous plot (a PNG image drawn by matplotlib); "
        "remove it or give another --out FILE"
    )
    assert (tmp_path / "file").read_text() == "mine"
    (run / "loss.png").write_text("notes")
    assert run_error(capsys, "plot", str(run)) == (
        f"error: {run / 'loss.png'} already exists and is not a previous plot (a PNG image drawn by matplotlib); "
        "remove it or give --out FILE"
    )
    (tmp_path / "old.eps").write_text("%!PS")
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "old.eps")) == (
        f"error: {tmp_path / 'old.eps'} already exists, and plot replaces only a previous plot it recognizes (a PNG "
        "image, a PDF or an SVG image); remove it or give another --out FILE"
    )
    others = {
        "photo.png": b"\x89PNG\r\n\x1a\n" + bytes(100),
        "doc.pdf": b"%PDF-1.4\n%%EOF\n",
        "art.svg": b"<?xml ?><svg/>",
    }
    for name, content in others.items():  # the right format, but not drawn by matplotlib: someone else's
        (tmp_path / name).write_bytes(content)
        what = {"png": "a PNG image", "pdf": "a PDF", "svg": "an SVG image"}[name[-3:]]
        assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / name)) == (
            f"error: {tmp_path / name} already exists and is not a previous plot ({what} drawn by matplotlib); "
            "remove it or give another --out FILE"
        )
        assert (tmp_path / name).read_bytes() == content
    (run / "loss.png").unlink()
    for _ in range(2):  # the second time over the first one's plot
        assert main(["plot", str(run), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"png": str(run / "loss.png")}
        for name in ("loss.pdf", "loss.svg"):
            assert main(["plot", str(run), "--out", str(tmp_path / name), "--json"]) == 0
            capsys.readouterr()
    assert (tmp_path / "loss.pdf").read_bytes().startswith(b"%PDF-")
    assert b"<svg" in (tmp_path / "loss.svg").read_bytes()
    assert leftovers(run) == [] and leftovers(tmp_path) == [] and (tmp_path / "file").read_text() == "mine"
    (tmp_path / "link.png").symlink_to(run / "loss.png")  # a previous plot, but through a link: the link is not one
    assert run_error(capsys, "plot", str(run), "--out", str(tmp_path / "link.png")) == (
        f"error: {tmp_path / 'link.png'} already exists and is not a previous plot (a PNG image drawn by matplotlib); "
        "remove it or give another --out FILE"
    )


def test_plot_where_the_default_loss_png_is_a_directory(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "loss.png").mkdir()
    assert run_error(capsys, "plot", str(run)) == (
        f"error: {run / 'loss.png'} is a directory, where plot writes its PNG by default; move it away, or give "
        "--out FILE"
    )


def test_ctrl_c_while_plot_writes_leaves_nothing(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    def interrupted(self: Figure, fname: Any, **kwargs: Any) -> None:
        fname.write(b"<?xml half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    for out in (tmp_path / "x.svg", run / "loss.png"):
        assert main(["plot", str(run), "--out", str(out)]) == 130
        assert capsys.readouterr().err == f"interrupted: nothing was written to {out}\n"
        assert not out.exists()
    assert leftovers(run) == [] and leftovers(tmp_path) == []

    def failing(self: Figure, fname: Any, **kwargs: Any) -> None:
        fname.write(b"<?xml half")
        raise ValueError("matplotlib's own failure")

    monkeypatch.setattr(Figure, "savefig", failing)
    with pytest.raises(ValueError, match="matplotlib's own failure"):  # a bug, not a user's error: it keeps its trace
        main(["plot", str(run), "--out", str(tmp_path / "x.svg")])
    assert leftovers(tmp_path) == [] and not (tmp_path / "x.svg").exists()


def test_plot_of_a_run_whose_losses_are_all_null(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": null}\n{"step": 1, "val_loss": null, "val_ppl": null}\n')
    assert run_error(capsys, "plot", str(run)) == (
        f"error: {run / 'metrics.jsonl'} has no finite losses to plot yet: the 2 record(s) it holds have null losses "
        "(non-finite)"
    )


# --- 8. half-deleted checkpoints ----------------------------------------------------------------


def test_incomplete_checkpoints_older_than_the_newest_complete_one_are_pruned(docs: Path, tmp_path: Path) -> None:
    """Of what they hold, only the files a save writes go; a directory that then still holds files stays."""
    out = tmp_path / "run"
    keep = ["train.checkpoint_every=1", "train.eval_every=0"]
    train(recipe("train.max_steps=3", "train.keep_checkpoints=5", *keep), out=out, data=docs)
    root = out / "checkpoints"
    (root / "step-000001" / "model.safetensors").unlink()  # half-deleted by hand
    (root / "step-000002" / "train_state.pt").unlink()
    (root / "step-000002" / "NOTES.txt").write_text("mine")
    (root / "step-000003" / "NOTES.txt").write_text("mine too")  # a complete one, pruned later
    train(recipe("train.max_steps=5", "train.keep_checkpoints=2", *keep), out=out, data=docs, resume=True)
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000003", "step-000004", "step-000005"]
    assert [p.name for p in (root / "step-000002").iterdir()] == ["NOTES.txt"]
    assert [p.name for p in (root / "step-000003").iterdir()] == ["NOTES.txt"]
    assert (root / "step-000003" / "NOTES.txt").read_text() == "mine too"
    assert [s for s, _ in run_dir.checkpoint_dirs(out)] == [4, 5]


def fifo(path: Path) -> None:
    os.mkfifo(path)


def dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


@pytest.mark.parametrize(
    ("make", "lack"),
    [
        (None, "its train_state.pt is missing"),
        (dangling, "its train_state.pt is a symbolic link to nothing"),
        (fifo, "its train_state.pt is a named pipe (FIFO)"),
        (Path.mkdir, "its train_state.pt is a directory"),
    ],
    ids=["deleted", "dangling", "fifo", "directory"],
)
def test_an_incomplete_checkpoint_newer_than_the_newest_complete_one_is_refused(
    run: Path,
    docs: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Any] | None,
    lack: str,
) -> None:
    """A save never leaves a visible incomplete step-N: one newer than the newest complete checkpoint is
    someone's files, which a resume from the older one would later replace."""
    newest, older = run / "checkpoints" / "step-000004", run / "checkpoints" / "step-000002"
    (newest / "train_state.pt").unlink()
    if make is not None:
        make(newest / "train_state.pt")
    (newest / "NOTES.txt").write_text("mine")
    before = snapshot(run)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: {newest} is incomplete ({lack}), yet newer than the last complete checkpoint {older}: a resume "
        f"would go back to step-000002 and later replace it; restore what it lacks, or move it away to resume from "
        f"{older}"
    )
    assert snapshot(run) == before and leftovers(run) == []


def test_an_incomplete_checkpoint_and_no_complete_one(
    run: Path, docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(run / "checkpoints" / "step-000002")
    newest = run / "checkpoints" / "step-000004"
    (newest / "model.safetensors").unlink()
    (newest / "train_state.pt").unlink()
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: {newest} is incomplete (its model.safetensors is missing and its train_state.pt is missing) and "
        f"{run} has no complete checkpoint to resume: restore what it lacks, or remove {run} and train without "
        "--resume"
    )
    assert sorted(p.name for p in newest.iterdir()) == ["recipe.toml"]


def test_checkpoints_that_are_symbolic_links_are_refused_untouched(
    trained: Path, run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume reads, writes and prunes only inside its run: RUN/checkpoints and every step-* in it are real
    directories."""
    other = Path(shutil.copytree(trained, tmp_path / "other"))  # another run, whose checkpoints must stay as they are
    (other / "checkpoints" / "step-000001").mkdir()
    (other / "checkpoints" / "step-000001" / "notes.txt").write_text("notes")
    before = snapshot(other)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    assert run_error(capsys, *argv(run, docs, "train.max_steps=8", "train.keep_checkpoints=1", resume=True)) == (
        f"error: {run / 'checkpoints'} is a symbolic link, not a directory; a resume reads and prunes only "
        f"checkpoints inside {run}: put a copy of the checkpoints there instead, or start a new --out"
    )
    (run / "checkpoints").unlink()
    (run / "checkpoints").write_text("a file")
    assert run_error(capsys, *argv(run, docs, "train.max_steps=8", resume=True)) == (
        f"error: {run / 'checkpoints'} is a file, not a directory; a resume reads and prunes only checkpoints inside "
        f"{run}: put a copy of the checkpoints there instead, or start a new --out"
    )
    (run / "checkpoints").unlink()
    (run / "checkpoints").mkdir()
    for step in ("step-000002", "step-000006"):  # an older one, and one newer than anything in the run
        (run / "checkpoints" / step).symlink_to(other / "checkpoints" / "step-000004")
    assert run_error(capsys, *argv(run, docs, "train.max_steps=8", resume=True)) == (
        f"error: {run / 'checkpoints' / 'step-000002'} is a symbolic link, not a checkpoint directory; a resume reads "
        f"and prunes only checkpoints inside {run}: move it away (a copy of a checkpoint may take its place)"
    )
    (run / "checkpoints" / "step-000002").unlink()
    (run / "checkpoints" / "step-000002").write_text("a file")
    assert run_error(capsys, *argv(run, docs, "train.max_steps=8", resume=True)) == (
        f"error: {run / 'checkpoints' / 'step-000002'} is a file, not a checkpoint directory; a resume reads and "
        f"prunes only checkpoints inside {run}: move it away (a copy of a checkpoint may take its place)"
    )
    assert snapshot(other) == before and leftovers(run) == []


# --- 9. Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_in_a_step_says_what_was_kept_and_releases_the_lock(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    spec = recipe("train.max_steps=10", "train.checkpoint_every=4", "train.eval_every=0")
    stop_at(monkeypatch, 7, KeyboardInterrupt())
    with pytest.raises(Interrupted) as exc:
        train(spec, out=out, data=docs)
    assert str(exc.value) == (
        f"at step 7; the last complete checkpoint is {out / 'checkpoints' / 'step-000004'} (resume with --resume)"
    )
    assert leftovers(out) == []  # no temp files, and the lock is gone
    monkeypatch.undo()
    assert train(spec, out=out, data=docs, resume=True).steps == 10


def test_ctrl_c_during_a_save_or_before_any_checkpoint(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, real_save, saves = tmp_path / "run", torch.save, []

    def interrupted(obj: object, f: BinaryIO) -> None:
        saves.append(f)
        if len(saves) == 2:
            f.write(b"\x80\x02half")
            raise KeyboardInterrupt
        real_save(obj, f)

    monkeypatch.setattr(run_dir.torch, "save", interrupted)
    with pytest.raises(Interrupted) as exc:
        train(recipe(*STEPS), out=out, data=docs)
    assert str(exc.value) == (
        f"at step 4; the last complete checkpoint is {out / 'checkpoints' / 'step-000002'} (resume with --resume)"
    )
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"] and leftovers(out) == []
    stop_at(monkeypatch, 1, KeyboardInterrupt())
    with pytest.raises(Interrupted) as exc:
        train(recipe(*STEPS), out=tmp_path / "fresh", data=docs)
    assert str(exc.value) == "at step 1; no checkpoint had been written, so nothing was kept"
    assert not (tmp_path / "fresh").exists()  # so that the same command can run again


def test_ctrl_c_before_the_first_checkpoint_leaves_nothing(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failure does: there is nothing to resume, and the same command can run again."""
    (tmp_path / "empty").mkdir()  # a directory the person made: it stays, as empty as it was
    stop_at(monkeypatch, 1, KeyboardInterrupt())
    for out in (tmp_path / "new", tmp_path / "empty"):
        assert main(argv(out, docs, *STEPS)) == 130
        assert (
            capsys.readouterr().err == "interrupted: at step 1; no checkpoint had been written, so nothing was kept\n"
        )
    assert sorted(tmp_path.iterdir()) == [tmp_path / "empty"] and list((tmp_path / "empty").iterdir()) == []
    monkeypatch.undo()
    assert main(argv(tmp_path / "new", docs, *STEPS)) == 0  # the same command again
    assert json.loads(capsys.readouterr().out)["steps"] == 4


class InterruptedFile:
    """A file whose third write is interrupted by Ctrl-C, as SIGINT arrives while torch.save writes."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.writes = f, 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes == 3:
            raise KeyboardInterrupt
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def test_ctrl_c_inside_torch_save_is_an_interrupted_run(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.save turns it into its own error ("[enforce fail at inline_container.cc] unexpected pos")."""
    out, real_save, saves = tmp_path / "run", torch.save, []

    def save(obj: object, f: BinaryIO) -> None:
        saves.append(f)
        real_save(obj, InterruptedFile(f) if len(saves) == 2 else f)

    monkeypatch.setattr(run_dir.torch, "save", save)
    assert main(argv(out, docs, *STEPS)) == 130
    captured = capsys.readouterr()
    assert captured.err == (
        f"interrupted: at step 4; the last complete checkpoint is {out / 'checkpoints' / 'step-000002'} (resume with "
        "--resume)\n"
    )
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"] and leftovers(out) == []


def test_ctrl_c_exits_130_from_the_command_line(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    stop_at(monkeypatch, 3, KeyboardInterrupt())
    try:
        code = main(argv(out, docs, *STEPS))
    except KeyboardInterrupt:  # escaping, it would end the whole pytest session
        pytest.fail("gptzoo.cli.main let Interrupted escape; it must print the message and return 130")
    assert code == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert (
        f"interrupted: at step 3; the last complete checkpoint is {out / 'checkpoints' / 'step-000002'} "
        "(resume with --resume)"
    ) in " ".join(captured.err.split())


def test_ctrl_c_during_prepare_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(data_mod.Corpus, "describe", interrupted)
    with pytest.raises(Interrupted) as exc:
        prepare("stdlib-docs", tmp_path / "out", tokenizer="bytes")
    assert str(exc.value) == f"nothing was written to {tmp_path / 'out'}"
    assert list(tmp_path.iterdir()) == []


# --- everything else ----------------------------------------------------------------------------


def test_out_or_data_that_is_a_file(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "file"
    file.write_text("mine")
    assert run_error(capsys, *argv(file, docs, *STEPS)) == (
        f"error: --out {file} is a file, not a run directory; choose another --out"
    )
    assert run_error(capsys, *argv(tmp_path / "run", file, *STEPS)) == (
        f"error: {file} is a file, not prepared data; give the directory `gptzoo prepare --out DIR` wrote "
        "(train.bin, val.bin, meta.json)"
    )
    assert file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        (
            {"tokenizer": "bytes"},
            'tokenizer is \'bytes\', expected an object with the tokenizer\'s name, e.g. {"name": "gpt2"}',
        ),
        (
            {"tokenizer": None},
            'tokenizer is None, expected an object with the tokenizer\'s name, e.g. {"name": "gpt2"}',
        ),
        ({"train_tokens": 0}, "train_tokens is 0, expected a positive integer"),
        ({"vocab_size": True}, "vocab_size is True, expected a positive integer"),
        ({"dtype": None}, "dtype is None, expected 'uint16' or 'uint32'"),
        (
            {"tokenizer": {"name": "bytes", "vocab_sha256": "abc"}},
            "tokenizer.vocab_sha256 is 'abc', expected a sha256 (64 hexadecimal digits)",
        ),
        ({"dtype": "u" * 100}, f"dtype is '{'u' * 36}..., expected 'uint16' or 'uint32'"),
    ],
)
def test_odd_meta_json_fields(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], meta: dict[str, Any], problem: str
) -> None:
    data = damaged_copy(docs, tmp_path, **meta)
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data / 'meta.json'} is corrupt: {problem}; run `gptzoo prepare SOURCE --out DIR` again into a new DIR"
    )


def test_an_empty_train_bin(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = damaged_copy(docs, tmp_path)
    (data / "train.bin").write_bytes(b"")
    n = json.loads((data / "meta.json").read_text())["train_tokens"]
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data / 'train.bin'} has 0 bytes, but meta.json says {n} uint16 tokens ({2 * n} bytes); "
        "the data is damaged, prepare it again"
    )


def test_meta_json_counts_of_hundreds_of_digits(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    size = (docs / "train.bin").stat().st_size
    data = damaged_copy(docs, tmp_path, train_tokens=10**400)
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data / 'train.bin'} has {size} bytes, but meta.json says 10000000... (401 digits) uint16 tokens "
        "(20000000... (401 digits) bytes); the data is damaged, prepare it again"
    )
    data = damaged_copy(docs, tmp_path / "b", vocab_size=10**400)
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data} was prepared for a vocabulary of 10000000... (401 digits) tokens (meta.json vocab_size), but "
        "the model's vocab_size is 256; use a recipe with vocab_size >= 10000000... (401 digits) or prepare the data "
        "with the recipe's tokenizer"
    )
    data = damaged_copy(docs, tmp_path / "c")
    (data / "meta.json").write_text(
        (data / "meta.json").read_text().replace('"val_tokens": ', '"val_tokens": 9' + "9" * 5000)
    )
    assert run_error(capsys, *argv(tmp_path / "run", data, *STEPS)) == (
        f"error: {data / 'meta.json'} is corrupt (it holds a number too long to read); run `gptzoo prepare SOURCE "
        "--out DIR` again into a new DIR"
    )
    assert not (tmp_path / "run").exists()


def test_resume_when_metrics_jsonl_is_a_directory(run: Path, docs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
        f"error: cannot write {run / 'metrics.jsonl'}: Is a directory; the previous checkpoint "
        f"{run / 'checkpoints' / 'step-000004'} is intact (resume with --resume once this is fixed)"
    )
    assert leftovers(run) == []


# --- 10. data and run directories that are not what they seem -----------------------------------


def test_data_that_is_a_symbolic_link_loop(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("loop").symlink_to("loop")
    out = tmp_path / "run"
    assert run_error(capsys, *argv(out, Path("loop"), *STEPS)) == (
        "error: --data loop leads into a loop of symbolic links; give the directory `gptzoo prepare --out DIR` wrote"
    )
    args = [a for a in argv(out, docs, *STEPS, "train.data=loop") if a not in ("--data", str(docs))]
    assert run_error(capsys, *args) == (
        "error: train.data loop leads into a loop of symbolic links; give the directory `gptzoo prepare --out DIR` "
        "wrote"
    )
    assert not out.exists()


def flag(args: list[str], name: str, value: str) -> list[str]:
    """``args`` with flag ``name``'s value replaced."""
    i = args.index(name)
    return [*args[: i + 1], value, *args[i + 2 :]]


def test_an_empty_out_or_data_and_an_out_that_is_a_symbolic_link(
    run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = argv(tmp_path / "new", docs, *STEPS)
    assert run_error(capsys, *flag(args, "--out", "")) == (
        "error: --out is empty; give the run directory (by default runs/RECIPE)"
    )
    assert run_error(capsys, *flag(args, "--data", "")) == (
        "error: --data is empty; give the directory `gptzoo prepare --out DIR` wrote"
    )
    Path("link").symlink_to(run)
    Path("dangling").symlink_to("nowhere")
    for link in ("link", "dangling"):
        assert run_error(capsys, *flag(argv(Path(link), docs, "train.max_steps=6", resume=True), "--out", link)) == (
            f"error: --out {link} is a symbolic link; give the run directory itself, or another --out"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "run"]


# --- 11. non-finite numbers -----------------------------------------------------------------------


def test_a_non_finite_loss_in_a_new_run_leaves_nothing_so_the_advice_works(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert run_error(capsys, *argv(out, docs, "train.lr=1e30", "train.max_steps=2")) == (
        "error: step 2: the loss is nan; no checkpoint had been written, so nothing was kept: train again with a lower "
        "train.lr, in float32, or with --set train.on_nonfinite=skip"
    )
    assert not out.exists()
    assert main(argv(out, docs, "train.lr=1e30", "train.max_steps=2", "train.on_nonfinite=skip")) == 0
    assert json.loads(capsys.readouterr().out)["skipped_steps"] == 1
    assert run_error(capsys, *argv(tmp_path / "eps", docs, "train.eps=0")) == (
        "error: --set train.eps=0: [train] eps=0.0 must be a finite number > 0 (AdamW divides by it)"
    )


def test_a_non_finite_val_loss_or_mfu_is_null_in_the_summary_and_the_metrics(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train_mod.Trainer, "evaluate", lambda self: float("nan"))
    out = tmp_path / "run"
    sets = [a for o in [*TINY, *STEPS, "train.on_nonfinite=skip"] for a in ("--set", o)]
    command = ["train", "gpt2-tiny", *sets, "--data", str(docs), "--out", str(out)]
    assert main(command) == 0  # for people: the progress display shows it
    captured = capsys.readouterr()
    assert "step 4: val loss nan, perplexity nan" in captured.err and "Traceback" not in captured.err
    assert captured.out.startswith("4 steps, loss ") and ", val loss nan; checkpoint " in captured.out
    command = flag(command, "--out", str(tmp_path / "json"))
    assert main([*command, "--set", "train.peak_tflops=5e-324", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the summary"))
    assert summary["val_loss"] is None and summary["mfu"] is None
    for run in (out, tmp_path / "json"):
        for line in (run / "metrics.jsonl").read_text().splitlines():
            json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))


# --- 12. torch.compile without a C++ compiler -------------------------------------------------------


@pytest.fixture
def no_compiler() -> Iterator[None]:
    """torch's inductor looks for a C++ compiler where there is none (as with CXX=/nonexistent/g++)."""
    from torch._inductor import config, cpp_builder

    cpp_builder.cpp_compiler_search.cache_clear()
    try:
        with config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
            yield
    finally:
        cpp_builder.cpp_compiler_search.cache_clear()
        torch._dynamo.reset()


@pytest.mark.usefixtures("no_compiler")
def test_compile_without_a_cpp_compiler(
    run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "new"
    assert run_error(capsys, *argv(out, docs, *STEPS, "train.compile=true")) == (
        "error: train.compile = true needs a working C++ compiler on CPU (No working C++ compiler found in "
        "torch._inductor.config.cpp.cxx: (None, '/nonexistent/g++')); install one (g++), point $CXX at it, or set "
        "train.compile=false"
    )
    assert not out.exists()
    monkeypatch.setattr(train_mod, "check_compile", lambda device: None)  # a failure only torch.compile finds
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler(gm: Any, example_inputs: Any) -> Any:  # as inductor fails (its caches may hold a kernel already)
        raise InvalidCxxCompiler

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend=no_compiler))
    failed = (
        "error: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found in "
        "torch._inductor.config.cpp.cxx: (None, '/nonexistent/g++')); "
    )
    assert run_error(capsys, *argv(out, docs, *STEPS, "train.compile=true")) == (
        f"{failed}no checkpoint had been written, so nothing was kept: train again with --set train.compile=false"
    )
    assert not out.exists()  # so that it can
    before = snapshot(run)
    assert run_error(capsys, *argv(run, docs, "train.max_steps=6", "train.compile=true", resume=True)) == (
        f"{failed}the last checkpoint {run / 'checkpoints' / 'step-000004'} is intact: resume with --resume --set "
        "train.compile=false"
    )
    after = snapshot(run)
    assert after.pop("recipe.toml") != before.pop("recipe.toml")  # it says compile = true: what this resume ran
    assert after == before and leftovers(run) == []
    assert main(argv(run, docs, "train.max_steps=6", "train.compile=false", resume=True)) == 0


# --- 13. what a person sees -----------------------------------------------------------------------


def test_a_refused_run_prints_its_error_alone(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The progress display starts once every check has passed: no empty bar before the error."""
    args = [a for a in argv(tmp_path / "run", tmp_path / "nowhere", *STEPS) if a != "--json"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: no prepared data at {tmp_path / 'nowhere'}; run `gptzoo prepare SOURCE --out "
        f"{tmp_path / 'nowhere'}` first\n"
    )


def test_ctrl_c_before_the_run_starts(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(gptzoo.recipe, "load_recipe", interrupted)  # gptzoo train imports it when it runs
    assert main(argv(tmp_path / "run", docs, *STEPS)[:-1]) == 130
    assert capsys.readouterr().err == "interrupted: before the first step; nothing was written\n"
    monkeypatch.undo()
    monkeypatch.setattr(data_mod.TokenData, "open", interrupted)
    assert main(argv(tmp_path / "run", docs, *STEPS)[:-1]) == 130
    assert capsys.readouterr().err == "interrupted: before the first step; nothing was written\n"
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoints_files_must_be_inside_it(
    run: Path, docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed checkpoint is untrusted input like any other: a file linked from outside is refused, unread."""
    step = run / "checkpoints" / "step-000004"
    for name in ("train_state.pt", "model.safetensors"):
        outside = tmp_path / f"outside-{name}"
        (step / name).rename(outside)
        (step / name).symlink_to(outside)
        assert run_error(capsys, *argv(run, docs, "train.max_steps=6", resume=True)) == (
            f"error: {step / name} links to {outside}, outside {step}; every file a checkpoint supplies must be "
            "inside its directory (after following symlinks)"
        )
        (step / name).unlink()
        outside.rename(step / name)


def test_an_out_name_that_is_not_utf8_is_refused_before_the_run(
    docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run\udcff"
    assert run_error(capsys, *argv(out, docs, *STEPS)) == (
        f"error: the directory name {str(out)!r} is not valid UTF-8 (byte 0xff at character {len(str(out)) - 1}), and "
        "safetensors reads and writes only UTF-8 paths; rename it"
    )
    assert list(tmp_path.iterdir()) == []

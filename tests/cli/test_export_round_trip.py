"""`gptzoo export` -> `compare` / `eval`: an export of a gpt2- or bytes-tokenizer model carries tokenizer files
that encode as gptzoo's tokenizer does, so transformers loads it whole; `export RUN_DIR` takes the run's newest
checkpoint and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_json
from tiny import TRAIN

from gptzoo.cli import main

TEXT = "ROMEO: Hello, world! <|endoftext|> héllo wörld ✓\n  two spaces, then a tab\tand the end."


@pytest.mark.parametrize(("recipe", "files"), [("gpt2-tiny", 50257), ("shakespeare-bytes", 256)])
def test_export_then_compare_and_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recipe: str, files: int
) -> None:
    ck, ex, text = tmp_path / "ck", tmp_path / "ex", tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["build", recipe, "--out", str(ck), "--json"]) == 0
    capsys.readouterr()
    assert run_json(capsys, "export", str(ck), "--hf", str(ex)) == {"hf": str(ex), "weights": f"checkpoint {ck}"}
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in ex.iterdir()}
    assert len(json.loads((ex / "tokenizer.json").read_text())["model"]["vocab"]) == files
    compared = run_json(capsys, "compare", str(ex), "--prompt", TEXT, "--new-tokens", "8")
    assert compared["max_abs_diff"] < 1e-4 and compared["greedy_match"] and compared["top1_agreement"] == 1.0
    ours, theirs = (run_json(capsys, "eval", str(m), "--text", str(text), "--lengths", "32") for m in (ck, ex))
    a, b = ours["scores"][0], theirs["scores"][0]
    assert (a["tokens"], a["bytes"]) == (b["tokens"], b["bytes"])  # the same tokens: the tokenizers agree
    assert abs(a["loss"] - b["loss"]) < 1e-5


def test_export_of_a_run_directory_takes_its_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["prepare", "stdlib-docs", "--tokenizer", "bytes", "--out", str(data), "--json"]) == 0
    sets = [a for o in [*TRAIN, "train.max_steps=2", "train.checkpoint_every=1"] for a in ("--set", o)]
    assert main(["train", "shakespeare-bytes", *sets, "--data", str(data), "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(tmp_path / "ex")]) == 0
    newest = run / "checkpoints" / "step-000002"
    assert " ".join(capsys.readouterr().out.split()) == (
        f"Hugging Face checkpoint of checkpoint {newest} (the newest of run {run}) written to {tmp_path / 'ex'}"
    )
    assert run_json(capsys, "compare", str(tmp_path / "ex"), "--new-tokens", "4")["greedy_match"]

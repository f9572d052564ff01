"""`gptzoo eval`: sliding windows, loss / perplexity / bits per byte against hand computations and
transformers, length extrapolation and its refusal, and the command's errors."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

import gptzoo
from gptzoo.evaluation import eval_model
from gptzoo.evaluation.perplexity import bootstrap
from gptzoo.evaluation.windows import windows
from gptzoo.loader import Loaded, load_any
from gptzoo.model.checkpoint import save_checkpoint
from gptzoo.tokenizer import gpt2_bpe_files, load_tokenizer
from gptzoo.training.data import TokenData
from tests.cli_run import run_error, run_json

TEXT = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
    "And by opposing end them. To die: to sleep; — naïve café.\n"
)


@pytest.mark.parametrize("n", [2, 3, 17, 64, 65, 100, 257])
@pytest.mark.parametrize(("length", "stride"), [(1, 1), (8, 8), (8, 3), (16, 5), (64, 32)])
def test_windows_score_every_target_once_with_the_context_promised(n: int, length: int, stride: int) -> None:
    seen: list[int] = []
    plan = windows(n, length, stride)
    for w in plan:
        end = w.begin + w.length
        assert 0 <= w.begin and end <= n - 1 and w.length == min(length, n - 1)
        targets = list(range(end - w.scored + 1, end + 1))
        seen += targets
        if w is not plan[0]:  # a later window: every scored target has length - stride tokens of context at least
            assert targets[0] - w.begin >= length - stride
    assert seen == list(range(1, n))


def _text_file(tmp_path: Path, text: str = TEXT) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return path


def _loaded(recipe: str, *overrides: str) -> Loaded:
    torch.manual_seed(0)
    r = gptzoo.load_recipe(recipe, overrides)
    return Loaded(gptzoo.build_model(r).eval(), r, "random initialization")


def _nll(model: gptzoo.GPT, ids: list[int]) -> tuple[float, int]:
    """Summed loss of ids[1:] from one forward over ids[:-1]."""
    x = torch.tensor([ids[:-1]])
    with torch.no_grad():
        logits = model(x)[0]
    return float(F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum")), len(ids) - 1


def test_one_window_equals_the_forward_by_hand(tmp_path: Path) -> None:
    loaded = _loaded("gpt2-tiny")
    ids = [50256, *load_tokenizer("gpt2").encode(TEXT)]  # GPT-2's <|endoftext|> is its BOS: put in front
    report = eval_model(loaded, texts=[_text_file(tmp_path)], lengths=[128])
    score = report["scores"][0]
    total, count = _nll(loaded.model, ids)
    assert score["tokens"] == count == len(ids) - 1 and score["windows"] == 1
    assert score["loss"] == pytest.approx(total / count, rel=1e-6)
    assert score["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-6)
    assert score["bytes"] == len(TEXT.encode())  # every byte is scored after the BOS
    assert score["bits_per_byte"] == pytest.approx(total / math.log(2) / len(TEXT.encode()), rel=1e-6)
    assert score["loss_ci"] is None  # one window: no interval


def test_sliding_windows_equal_the_forward_by_hand(tmp_path: Path) -> None:
    loaded = _loaded("llama-tiny", "tokenizer.name=bytes", "model.vocab_size=256")
    ids = list(TEXT.encode())
    report = eval_model(loaded, texts=[_text_file(tmp_path)], lengths=[32], stride=12, batch_size=3)
    total = 0.0
    for w in windows(len(ids), 32, 12):  # the hand loop: each window alone, its last `scored` predictions
        x = torch.tensor([ids[w.begin : w.begin + w.length]])
        with torch.no_grad():
            logits = loaded.model(x)[0, -w.scored :]
        end = w.begin + w.length
        total += float(F.cross_entropy(logits, torch.tensor(ids[end - w.scored + 1 : end + 1]), reduction="sum"))
    score = report["scores"][0]
    assert score["tokens"] == len(ids) - 1 and score["windows"] == len(windows(len(ids), 32, 12)) > 10
    assert score["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-6)
    assert score["bytes"] == len(TEXT.encode()) - 1  # no BOS: the first byte is context only
    low, high = score["loss_ci"]
    assert low < score["loss"] < high


def test_bits_per_byte_agree_across_tokenizers_on_a_uniform_model(tmp_path: Path) -> None:
    """A model that gives every token the same probability: bytes model 8 bits per byte exactly; GPT-2
    log2(50257) bits per token over the bytes those tokens stand for."""
    path = _text_file(tmp_path)
    results = {}
    for recipe, overrides in (("gpt2-tiny", ("tokenizer.name=bytes", "model.vocab_size=256")), ("gpt2-tiny", ())):
        loaded = _loaded(recipe, *overrides)
        with torch.no_grad():
            loaded.model.wte.weight.zero_()  # tied head: zero logits
        results[loaded.recipe.tokenizer.name] = eval_model(loaded, texts=[path], lengths=[64])["scores"][0]
    assert results["bytes"]["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)
    gpt2 = results["gpt2"]
    assert gpt2["bytes"] == results["bytes"]["bytes"] + 1 == len(TEXT.encode())
    assert gpt2["bits_per_byte"] == pytest.approx(math.log2(50257) * gpt2["tokens"] / gpt2["bytes"], rel=1e-6)
    assert gpt2["bits_per_byte"] < results["bytes"]["bits_per_byte"] * 2.5  # same unit, same order


def test_learned_positions_refuse_lengths_past_their_table_and_rope_extrapolates(tmp_path: Path) -> None:
    path = _text_file(tmp_path, TEXT * 4)
    learned = eval_model(_loaded("gpt2-tiny", "tokenizer.name=bytes", "model.vocab_size=256"), texts=[path],
                         lengths=[64, 128, 256, 512])  # fmt: skip
    refused = {s["length"]: s["refused"] for s in learned["scores"]}
    assert refused[64] is None and refused[128] is None
    assert (
        refused[256]
        == "length 256 is longer than the 128 positions that LearnedPosition encodes; evaluate at 128 or fewer"
    )
    assert (
        refused[512]
        == "length 512 is longer than the 128 positions that LearnedPosition encodes; evaluate at 128 or fewer"
    )
    assert learned["max_positions"] == 128
    rope = eval_model(_loaded("llama-tiny", "tokenizer.name=bytes", "model.vocab_size=256"), texts=[path],
                      lengths=[128, 512])  # fmt: skip
    assert rope["max_positions"] is None and [s["refused"] for s in rope["scores"]] == [None, None]
    assert rope["context_length"] == 128 and rope["scores"][1]["longest"] == 512


def test_bootstrap_is_fixed_and_brackets_the_ratio() -> None:
    rng = np.random.default_rng(3)
    nll, count = rng.uniform(10, 20, 50), np.full(50, 8.0)
    a, b = bootstrap(nll, count), bootstrap(nll, count)
    assert a == b and a[0] < nll.sum() / count.sum() < a[1]


def _hf_gpt2_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50257, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path / "hf"
    model.save_pretrained(path)
    vocab_bpe, encoder_json = gpt2_bpe_files()
    transformers.GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe)).save_pretrained(path)
    return path


def test_hf_directory_equals_transformers_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _hf_gpt2_dir(tmp_path)
    text = _text_file(tmp_path, TEXT * 2)
    report = run_json(capsys, "eval", str(path), "--text", str(text), "--lengths", "24,64", "--stride", "10")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = [tok.bos_token_id, *tok.encode(TEXT * 2)]
    for score in report["scores"]:
        total = 0.0
        for w in windows(len(ids), score["length"], 10):  # each window through transformers, its last predictions
            x = torch.tensor([ids[w.begin : w.begin + w.length + 1]])
            with torch.no_grad():
                logits = hf(x[:, :-1]).logits[0, -w.scored :]
            total += float(F.cross_entropy(logits, x[0, -w.scored :], reduction="sum"))
        assert score["loss"] == pytest.approx(total / score["tokens"], rel=1e-4)
        assert score["tokens"] == len(ids) - 1
    assert report["weights"].startswith("Hugging Face checkpoint")


@pytest.fixture(scope="module")
def bytes_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Prepared bytes data and a run of 2 steps on it."""
    from gptzoo.training.data import prepare
    from gptzoo.training.trainer import train

    tmp = tmp_path_factory.mktemp("run")
    _text_file(tmp, TEXT * 8)
    prepare(str(tmp / "text.txt"), tmp / "data", tokenizer="bytes", val_fraction=0.25)
    recipe = gptzoo.load_recipe(
        "shakespeare-bytes", ["model.n_layer=1", "train.max_steps=2", "train.seq_len=32", "train.micro_batch_size=2"]
    )
    train(recipe, out=tmp / "run", data=tmp / "data")
    return tmp / "data", tmp / "run"


def test_runs_and_checkpoints_are_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bytes_run: tuple[Path, Path]
) -> None:
    _, run = bytes_run
    text = _text_file(tmp_path)
    newest = run / "checkpoints" / "step-000002"
    assert load_any(run).checkpoint == newest
    scores = [
        run_json(capsys, "eval", str(source), "--text", str(text), "--lengths", "32")["scores"][0]["loss"]
        for source in (run, newest)
    ]
    assert scores[0] == scores[1] and 0 < scores[0] < 8


def test_a_stderr_that_is_not_a_terminal_gets_status_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bytes_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gptzoo eval 2>file` writes plain lines of the windows scored and the times, not a bar."""
    from gptzoo import status_lines
    from gptzoo.cli import main

    monkeypatch.setattr(status_lines, "STATUS_S", 0.0)
    _, run = bytes_run
    assert main(["eval", str(run), "--text", str(_text_file(tmp_path)), "--lengths", "32"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval: ")]
    assert lines and all(re.fullmatch(r"eval: \d+/(\d+) windows, \d+ s elapsed(, about \d+ s left)?", x) for x in lines)
    assert lines[-1].split()[1].split("/")[0] == lines[-1].split()[1].split("/")[1]  # the last window


def test_prepared_data_is_its_val_split(capsys: pytest.CaptureFixture[str], bytes_run: tuple[Path, Path]) -> None:
    data, run = bytes_run
    score = run_json(capsys, "eval", str(run), "--data", str(data), "--lengths", "64")["scores"][0]
    val = TokenData.open(data).val
    assert score["tokens"] == len(val) - 1 and score["bytes"] == len(val) - 1
    assert score["text"] == str(data)
    mixed = run_error(capsys, "eval", str(run), "--data", str(data), "--set", "tokenizer.name=gpt2")
    assert "tokenizer" in mixed, mixed


def test_prepared_data_is_sampled_by_default_and_all_of_it_on_request(
    capsys: pytest.CaptureFixture[str], bytes_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corpus's val.bin may hold millions of tokens: `eval --data` scores the first DATA_SAMPLE, says so and
    how to score them all (`--max-tokens all`); a --text file is scored whole."""
    from gptzoo.cli import eval as eval_command
    from gptzoo.cli import main

    monkeypatch.setattr(eval_command, "DATA_SAMPLE", 200)
    data, run = bytes_run
    total = len(TokenData.open(data).val)
    assert total > 200
    assert main(["eval", str(run), "--data", str(data), "--lengths", "64"]) == 0
    captured = capsys.readouterr()
    assert (
        f"warning: --data {data}: scoring the first 200 of its {total:,} val tokens; --max-tokens all scores them all"
        in " ".join(captured.err.split())
    )
    assert run_json(capsys, "eval", str(run), "--data", str(data), "--lengths", "64")["scores"][0]["tokens"] == 199
    every = run_json(capsys, "eval", str(run), "--data", str(data), "--lengths", "64", "--max-tokens", "all")
    assert every["scores"][0]["tokens"] == total - 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["gpt2-tiny", "--text", "{text}"], "recipe 'gpt2-tiny' has no [weights]: its random weights have nothing"),
        (["{ckpt}"], "nothing to evaluate on: give --text FILE or --data DIR"),
        (["{ckpt}", "--text", "{missing}"], "no such file"),
        (["{ckpt}", "--text", "/dev/zero"], "--text /dev/zero is not a regular file"),
        (["{ckpt}", "--text", "{tmp}"], "is a directory; give a text file"),
        (["{ckpt}", "--text", "{text}", "--lengths", "16,64", "--stride", "32"], "--stride 32 is longer than"),
        (["{ckpt}", "--text", "{text}", "--lengths", "0"], "must be between 1 and"),
        (["{tmp}", "--text", "{text}"], "is a directory but not a model"),
        (["{empty_run}", "--text", "{text}"], "has no complete checkpoint yet"),
    ],
)
def test_bad_input_names_the_culprit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    loaded = _loaded("gpt2-tiny", "tokenizer.name=bytes", "model.vocab_size=256")
    save_checkpoint(loaded.model, loaded.recipe, tmp_path / "ckpt")
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    names = {
        "text": str(_text_file(tmp_path)),
        "ckpt": str(tmp_path / "ckpt"),
        "missing": str(tmp_path / "nope.txt"),
        "tmp": str(tmp_path / "plain"),
        "empty_run": str(tmp_path / "empty_run"),
    }
    message = run_error(capsys, "eval", *(a.format(**names) for a in argv))
    assert expected in message, message


def test_bytes_count_the_text_not_separators_or_cut_characters(tmp_path: Path) -> None:
    gpt2, byte = load_tokenizer("gpt2"), load_tokenizer("bytes")
    doc = "naïve café — ünïcödé"
    ids = gpt2.encode(doc + "<|endoftext|>" + doc)  # prepared data joins documents with <|endoftext|>
    assert 50256 in ids and gpt2.n_bytes(ids) == 2 * len(doc.encode())
    assert sum(gpt2.n_bytes([i]) for i in ids) == gpt2.n_bytes(ids)  # token by token: exact, cut characters too
    assert byte.n_bytes(list("é".encode())[1:]) == 1  # half a character is one byte, not U+FFFD's three
    path = _text_file(tmp_path, "é" + TEXT)
    text = eval_model(_loaded("gpt2-tiny", "tokenizer.name=bytes", "model.vocab_size=256"), texts=[path], lengths=[64])
    assert text["scores"][0]["bytes"] == len(("é" + TEXT).encode()) - 1  # all but the first byte, which is context


def test_hf_tokenizers_count_decoded_text_without_special_tokens(tmp_path: Path) -> None:
    from gptzoo.tokenizer import HFTokenizer

    tok = HFTokenizer.from_dir(_hf_gpt2_dir(tmp_path))
    ids = [tok.eos_token_id, *tok.encode(TEXT), tok.eos_token_id]
    assert tok.n_bytes(ids) == len(TEXT.encode())


def test_tasks_without_the_harness_say_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in sys.modules if n == "lm_eval" or n.startswith("lm_eval.")] or ["lm_eval"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if lm-evaluation-harness were not installed
    monkeypatch.delitem(sys.modules, "gptzoo.evaluation.harness", raising=False)
    monkeypatch.delattr(gptzoo.evaluation, "harness", raising=False)  # imported by an earlier test: import it anew
    message = run_error(capsys, "eval", "gpt2-tiny", "--tasks", "hellaswag")
    assert message.endswith(
        "gptzoo eval --tasks needs lm-evaluation-harness (lm_eval is missing): pip install 'gptzoo[eval]'"
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--text", "notes.txt"], "error: --text notes.txt: no such file"),
        (["--text", "."], "error: --text . is a directory; give a text file (or prepared data with --data)"),
        (["--data", "."], "error: . is not prepared token data: meta.json is missing"),
    ],
)
def test_inputs_are_checked_before_the_model_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: list[str], message: str
) -> None:
    """A missing input is named at once, not after a load of the model (70-90 s for a real one): here the model,
    a recipe without weights, would be refused if it were loaded first."""
    monkeypatch.chdir(tmp_path)
    assert run_error(capsys, "eval", "gpt2-tiny", *given).startswith(message)

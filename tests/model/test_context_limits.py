"""One rule for how long a sequence may be (GPT.position_limit, GPT.context_length), held to alike by
`gptzoo generate` and `gptzoo eval` at its two boundaries: past what the positions encode, refused
with the limit, the component and the fix; past the trained context only, run with one warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from cli_run import run_error, run_json
from tiny import tiny_model

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import GptzooWarning

BYTES = ("tokenizer.name=bytes", "model.vocab_size=256")
"""One token per byte: a prompt of n letters is n tokens."""
PAST_CONTEXT = (
    "sequences of 129 tokens are longer than the context length 128 the model was trained at: its positions encode "
    "any length, so they run, but expect worse results past 128 tokens"
)


def _checkpoint(tmp_path: Path, recipe: str) -> str:
    model = tiny_model(recipe, *BYTES)
    return str(gptzoo.save_checkpoint(model, gptzoo.load_recipe(recipe, BYTES), tmp_path / recipe))


def _text(tmp_path: Path) -> str:
    path = tmp_path / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 8, encoding="utf-8")  # 360 bytes
    return str(path)


def test_the_model_states_its_limit_and_its_trained_context() -> None:
    learned, rope = tiny_model("gpt2-tiny"), tiny_model("llama-tiny")
    assert str(learned.position_limit) == "the 128 positions that LearnedPosition encodes"
    assert (learned.max_positions, learned.context_length) == (128, 128)
    assert (rope.position_limit, rope.max_positions, rope.context_length) == (None, None, 128)
    assert learned.past_context(128) is None and rope.past_context(128) is None
    assert rope.past_context(129) == PAST_CONTEXT


def test_generate_refuses_past_the_positions_and_warns_past_the_trained_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    learned, rope = _checkpoint(tmp_path, "gpt2-tiny"), _checkpoint(tmp_path, "llama-tiny")
    prompt = ["--prompt", "a" * 120, "--json"]
    assert main(["generate", learned, *prompt, "--max-new-tokens", "8"]) == 0  # 128: the last position
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["tokens"][0]) == 8 and captured.err == ""
    assert run_error(capsys, "generate", learned, *prompt, "--max-new-tokens", "9") == (
        "error: 120 prompt tokens + 9 new tokens (--max-new-tokens) exceed the 128 positions that LearnedPosition "
        "encodes; ask for at most 8"
    )
    assert run_error(capsys, "generate", learned, "--prompt", "a" * 129) == (
        "error: a prompt of 129 tokens is longer than the 128 positions that LearnedPosition encodes; shorten it"
    )
    assert main(["generate", rope, *prompt, "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["generate", rope, *prompt, "--max-new-tokens", "9"]) == 0  # past the trained context: it runs
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["tokens"][0]) == 9
    assert captured.err == f"warning: {PAST_CONTEXT}\n"  # once, though both the plan and the decoding check


def test_eval_refuses_past_the_positions_and_warns_past_the_trained_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    learned, rope, text = _checkpoint(tmp_path, "gpt2-tiny"), _checkpoint(tmp_path, "llama-tiny"), _text(tmp_path)
    assert main(["eval", learned, "--text", text, "--lengths", "128,129", "--json"]) == 0
    captured = capsys.readouterr()
    scores = json.loads(captured.out)["scores"]
    assert scores[0]["refused"] is None and scores[0]["longest"] == 128 and captured.err == ""
    assert scores[1]["refused"] == (
        "length 129 is longer than the 128 positions that LearnedPosition encodes; evaluate at 128 or fewer"
    )
    assert main(["eval", rope, "--text", text, "--lengths", "128,129", "--json"]) == 0
    captured = capsys.readouterr()
    assert [(s["refused"], s["longest"]) for s in json.loads(captured.out)["scores"]] == [(None, 128), (None, 129)]
    assert captured.err == f"warning: {PAST_CONTEXT}\n"
    assert main(["eval", rope, "--text", text, "--lengths", "128"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_eval_with_every_length_refused_is_an_error_and_a_partial_refusal_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    learned, text = _checkpoint(tmp_path, "gpt2-tiny"), _text(tmp_path)
    assert run_error(capsys, "eval", learned, "--text", text, "--lengths", "100000") == (
        "error: no requested length can be scored: length 100000 is longer than the 128 positions that "
        "LearnedPosition encodes; evaluate at 128 or fewer (--lengths)"
    )
    assert run_error(capsys, "eval", learned, "--text", text, "--lengths", "200,129,300") == (
        "error: no requested length can be scored: lengths 129, 200 and 300 are longer than the 128 positions that "
        "LearnedPosition encodes; evaluate at 128 or fewer (--lengths)"
    )
    assert main(["eval", learned, "--text", text, "--lengths", "64,129"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert (
        "length 129 refused: length 129 is longer than the 128 positions that LearnedPosition encodes; evaluate at "
        "128 or fewer" in shown
    )
    scores = run_json(capsys, "eval", learned, "--text", text, "--lengths", "64,129")["scores"]
    assert [(s["length"], s["refused"], s["loss"] is None) for s in scores] == [
        (64, None, False),
        (
            129,
            "length 129 is longer than the 128 positions that LearnedPosition encodes; evaluate at 128 or fewer",
            True,
        ),
    ]


def test_the_library_warns_once_with_a_gptzoo_warning() -> None:
    from gptzoo.inference.generate import generate

    model = tiny_model("llama-tiny", *BYTES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):
            generate(model, [[1] * 120], 9)
    assert [(w.category, str(w.message)) for w in caught] == [(GptzooWarning, PAST_CONTEXT)]

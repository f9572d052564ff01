"""Did-you-mean: one ranking (gptzoo.errors.closest) for every name a command takes."""

from __future__ import annotations

import pytest
from cli_run import run_error

from gptzoo.errors import closest, distance, suggest


def test_separators_and_case_do_not_count() -> None:
    assert distance("gpt-2", "gpt2") == (0, 0) and distance("GPT_2", "gpt2") == (0, 0)
    assert distance("gpt-2", "gpt2-xl") == (1, 2)  # a completion counts one, whatever it adds
    assert distance("smolm2", "smollm2-135m") == (2, 5)  # a slip in the part given, then a completion


def test_gpt_2_suggests_gpt2_first() -> None:
    assert closest("gpt-2", ["gpt2-xl", "gpt2-medium", "gpt2"]) == ["gpt2"]
    assert suggest("gpt-2", ["gpt2-xl", "gpt2", "bytes"]) == "; did you mean 'gpt2'?"
    # without an exact gpt2, the few gpt2-... names, the shortest completion first, at most four
    assert closest("gpt-2", ["bytes", "gpt2-small", "gpt2-xl", "gpt2-large", "gpt2-medium", "gpt2-tiny"]) == [
        "gpt2-xl",
        "gpt2-tiny",
        "gpt2-small",  # ties in the order given
        "gpt2-large",
    ]
    assert suggest("gpt2-smal", ["gpt2-small-postln", "gpt2-small"]) == (
        "; did you mean 'gpt2-small' or 'gpt2-small-postln'?"
    )


def test_a_far_name_gets_no_suggestion() -> None:
    assert closest("zzzz", ["norm", "mlp"]) == [] and suggest("x", []) == "" and closest("-", ["norm"]) == []
    assert closest("top_kk", ["top_p", "top_k"]) == ["top_k"]  # only the nearest, not the next


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["build", "gpt-2"],
            "unknown recipe 'gpt-2'; did you mean 'gpt2-xl', 'gpt2-tiny', 'gpt2-large' or 'gpt2-small'?",
        ),
        (["fetch", "smolm2"], "unknown fetchable model 'smolm2'; did you mean 'smollm2-135m'?"),
        (["list", "norm", "rms-norm"], "unknown norm 'rms-norm'; did you mean 'rmsnorm'?"),
        (["sweep", "postion"], "nor a shipped or a plugin's sweep; did you mean 'position'?"),
        (["prepare", "shakespear", "--out", "unused"], "not a corpus name; did you mean 'shakespeare'?"),
    ],
)
def test_every_command_suggests(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert expected in run_error(capsys, *argv)


@pytest.mark.parametrize(
    "argv",
    [["eval", "smolm2", "--text", __file__], ["compare", "smolm2"], ["generate", "--hf", "smolm2", "--prompt", "a"]],
)
def test_a_mistyped_fetch_name_as_model_is_suggested(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setenv("GPTZOO_OFFLINE", "1")
    message = run_error(capsys, *argv)
    assert message.startswith("error: 'smolm2' is not a local directory") and message.endswith(
        "; did you mean 'smollm2-135m'?"
    )

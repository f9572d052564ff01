"""A slow step says so on stderr (loading, converting, scoring, comparing), once it has run SLOW_S seconds,
and how long it took; a fast one says nothing, and --json keeps stderr free of them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

import gptzoo.cli.console
import gptzoo.loader
from gptzoo.cli import main


@pytest.fixture
def slow_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model takes 0.4 s, and a step is slow after 0.1 s."""
    load_any = gptzoo.loader.load_any

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.4)
        return load_any(*args, **kwargs)

    monkeypatch.setattr(gptzoo.loader, "load_any", slow)
    monkeypatch.setenv("GPTZOO_STATUS_S", "0.1")


@pytest.fixture
def ck(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["build", "shakespeare-bytes", "--out", str(tmp_path / "ck"), "--json"]) == 0
    (tmp_path / "t.txt").write_text("ROMEO: hello there, a short text to score.\n", encoding="utf-8")
    capsys.readouterr()
    return tmp_path / "ck"


def test_a_slow_load_says_so_on_stderr(ck: Path, slow_load: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(ck), "--text", str(ck.parent / "t.txt"), "--lengths", "16"]) == 0
    err = capsys.readouterr().err.splitlines()
    start = err.index(f"loading {ck}...")
    took = re.fullmatch(rf"loading {re.escape(str(ck))}: (\d+\.\d) s", err[start + 1])
    assert took is not None and float(took.group(1)) >= 0.4  # it slept that long


def test_a_quantizing_load_says_so(ck: Path, slow_load: None, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["eval", str(ck), "--text", str(ck.parent / "t.txt"), "--lengths", "16", "--dtype", "int4"]
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"loading {ck} and quantizing it to int4..." in err
    assert any(
        re.fullmatch(rf"loading {re.escape(str(ck))} and quantizing it to int4: \d+\.\d s", line) for line in err
    )


def test_the_delay_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("0", None), ("0.5", 0.5), ("soon", 2.0)):
        monkeypatch.setenv("GPTZOO_STATUS_S", value)
        assert gptzoo.cli.console.slow_after() == expected


def test_json_keeps_stderr_quiet(ck: Path, slow_load: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(ck), "--text", str(ck.parent / "t.txt"), "--lengths", "16", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["scores"][0]["tokens"] > 0


def test_a_fast_load_says_nothing(
    ck: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPTZOO_STATUS_S", "60")  # a step shorter than that: no line
    assert main(["export", str(ck), "--hf", str(ck.parent / "ex")]) == 0
    assert capsys.readouterr().err == ""

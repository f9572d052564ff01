"""Running the `gptzoo` command in-process, for tests: JSON output, or a user error's message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gptzoo.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """The parsed --json output of a command that must succeed."""
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line message of a command that must fail with exit status 2 and no traceback."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return " ".join(captured.err.split())

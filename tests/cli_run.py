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
    """The one-line message of a command that must fail with exit status 2 and no traceback; with
    --json, stdout holds the same error as a JSON object, otherwise nothing."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    message = " ".join(captured.err.split())
    if "--json" in argv:
        error = json.loads(captured.out)
        assert error["exit"] == 2 and message.endswith(" ".join(error["error"].split()))
    else:
        assert captured.out == ""
    return message

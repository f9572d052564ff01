"""docs/plugins.md tells the truth: every code block runs as the guide says, and its contract table
is gptzoo.hookspecs' (CONTRACTS and the hooks' docstrings).

The guide's conventions: a block whose first line is a comment naming a file (``# dir/name.py``) is
that file's content, written into a fresh directory before anything runs, and every directory it
gives a pyproject.toml is installed (tests/fakeproject.py: setuptools validates it, then it is a fake
installed distribution); the other ``python`` blocks run in order in one namespace, in this process;
each ``console`` block runs as one bash script (its ``$ `` lines) and prints what the other lines
show, where a ``...`` line stands for any number of lines and ``...`` in a line for any text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakeproject import install_project

from gptzoo import hookspecs
from gptzoo.hookspecs import CONTRACTS, KINDS

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
FILE = re.compile(r"# ([\w./-]+\.(?:py|toml))\n")


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(GUIDE)]


def _expected(shown: list[str]) -> re.Pattern[str]:
    """What a console block shows as a pattern over the command's whole output."""
    parts = [
        r"(?:[^\n]*\n)*" if line == "..." else ".*".join(map(re.escape, line.split("..."))) + r"\n" for line in shown
    ]
    return re.compile("".join(parts))


def _console(block: str, cwd: Path, env: dict[str, str]) -> None:
    lines = block.splitlines()
    commands = [line[2:] for line in lines if line.startswith("$ ")]
    shown = [line for line in lines if not line.startswith("$ ")]
    script = "set -euo pipefail\n" + "\n".join(commands)
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = done.stdout if done.stdout.endswith("\n") or not done.stdout else done.stdout + "\n"
    assert done.returncode == 0, f"{commands} exited with {done.returncode}:\n{output}"
    assert _expected(shown).fullmatch(output), f"{commands} printed:\n{output}\nthe guide shows:\n{chr(10).join(shown)}"


def test_every_code_block_runs_as_the_guide_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_site, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _blocks()
    assert blocks, "docs/plugins.md has no code blocks"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    files = [(FILE.match(code), code) for _, code in blocks]
    for match, code in files:
        if match:
            path = work / match.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code, encoding="utf-8")
    projects = sorted({p.parent for p in work.rglob("pyproject.toml")})
    assert [install_project(fake_site, p) for p in projects] == ["gptzoo-dyt", "gptzoo-scalenorm"]

    env = fake_site.env(PATH=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    env["PYTHONPATH"] += os.pathsep + str(REPO)  # the gptzoo under test
    namespace: dict[str, object] = {"__name__": "docs_plugins"}
    ran = {"python": 0, "console": 0}
    for (language, code), (match, _) in zip(blocks, files, strict=True):
        if match:
            continue
        assert language in ran, f"a {language or 'plain'} block that is not a file: it cannot run\n{code}"
        if language == "python":
            exec(compile(code, "docs/plugins.md", "exec"), namespace)
        else:
            _console(code, work, env)
        ran[language] += 1
    assert ran["python"] >= 4 and ran["console"] >= 3, ran


def _table() -> list[list[str]]:
    section = GUIDE[GUIDE.index("## The contracts") :]
    rows = re.findall(r"^\| (.*) \|$", section[: section.index("\n\n", section.index("| kind"))], re.M)
    return [[cell.strip() for cell in row.split(" | ")] for row in rows[2:]]


def _names(cell: str) -> list[str]:
    return [] if cell == "none" else re.findall(r"`(\w+)`", cell)


def test_the_contract_table_is_the_hookspecs_table() -> None:
    rows = _table()
    assert [row[0] for row in rows] == list(KINDS)
    for kind, hook, factory, members, optional, on_factory in rows:
        contract = CONTRACTS[kind]
        assert hook == f"`{contract.hook}`"
        doc = " ".join(getattr(hookspecs, contract.hook).__doc__.split())
        assert f"Factory: ``{factory.strip('`')}``" in doc, f"{kind}: {factory}"
        assert _names(members) == list(contract.members), kind
        assert _names(optional) == list(contract.optional), kind
        assert _names(on_factory) == list(contract.factory_optional), kind


def test_the_scaffold_kinds_the_guide_describes_are_every_kind() -> None:
    section = GUIDE[GUIDE.index("## Start from a scaffold") : GUIDE.index("## The contracts")]
    described = re.findall(r"for\s+`(\w+)`", section)
    assert sorted(described) == sorted(KINDS)


def test_the_native_batch_the_docs_state_is_the_code_s() -> None:
    from gptzoo.inference.matvec import MAX_ROWS

    assert f"a batch of up to {MAX_ROWS} rows (`MAX_ROWS`)" in " ".join(GUIDE.split())

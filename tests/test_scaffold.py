"""``gptzoo new-plugin``: the package it writes for every kind installs, registers its component and
passes the conformance kit (one kind all the way through pip into a fresh virtual environment and its
own pytest run); bad names, kinds and targets are refused with one message, and nothing is written."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_error
from fakedist import allow
from fakeproject import install_project

import gptzoo
from gptzoo.atomic import OWNER
from gptzoo.cli import main
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.scaffold import PLUGIN_NAME, new_plugin
from gptzoo.scaffold_templates import TEMPLATES
from gptzoo.testing import run_conformance

REPO = Path(gptzoo.__file__).resolve().parents[1]


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_there_is_a_template_for_each_kind_and_no_other() -> None:
    assert sorted(TEMPLATES) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_scaffolds_a_plugin_that_passes_the_kit(kind: str, tmp_path: Path, fake_site) -> None:
    name = f"my_{kind}"
    scaffold = new_plugin(name, kind, tmp_path / "plugin")
    assert scaffold.files == ("pyproject.toml", "README.md", f"gptzoo_{name}.py", f"tests/test_{name}.py")
    assert _tree(scaffold.directory) == sorted([*scaffold.files, "tests"])
    test_file = (scaffold.directory / "tests" / f"test_{name}.py").read_text(encoding="utf-8")
    assert test_file.endswith(
        f'\nfrom gptzoo.testing import conformance\n\ntest_{name} = conformance("{kind}", "{name}")\n'
    )

    assert install_project(fake_site, scaffold.directory) == f"gptzoo-my-{kind}"
    registry = gptzoo.get_registry()
    entry = registry.get(kind, name)
    assert (entry.provenance.plugin, entry.provenance.distribution) == (f"gptzoo_{name}", f"gptzoo-my-{kind}")
    results = run_conformance(registry, [entry])
    assert [(r.check, r.status, r.detail) for r in results if r.status != "passed"] == []
    checks = {r.check: r.detail for r in results}
    examples = getattr(entry.factory, "examples", [])
    assert checks["examples"] == f"{len(examples)} example parameter set{'s' if len(examples) != 1 else ''}"
    for params in examples:  # each declared parameter set was built and run
        shown = ",".join(f"{k}={v}" for k, v in params.items())
        assert f"build[{shown}]" in checks or f"build[plain,{shown}]" in checks, sorted(checks)
    assert {"flops", "kv_bytes"} & set(CONTRACTS[kind].members) <= set(checks)
    assert {(r.kind, r.name, r.distribution, r.version) for r in results} == {
        (kind, name, f"gptzoo-my-{kind}", "0.1.0")
    }


def test_scaffolds_are_formatted_and_lint_clean_under_ruffs_defaults(tmp_path: Path) -> None:
    for kind in KINDS:
        new_plugin(f"my_{kind}", kind, tmp_path / kind)
    ruff = [sys.executable, "-m", "ruff"]
    lint = "E4,E7,E9,F,W,I,B,UP"  # ruff's defaults, plus what gptzoo itself holds to, but line length
    for command in (
        [*ruff, "format", "--isolated", "--check", "."],
        [*ruff, "check", "--isolated", "--select", lint, "."],
    ):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def _venv(root: Path) -> Path:
    """A fresh virtual environment that also sees this interpreter's packages (torch, pytest, pip,
    setuptools, gptzoo: what a plugin author has installed); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # --system-site-packages reaches the base interpreter's packages, not those of a venv we run in.
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages())
    Path(purelib, "outer-site-packages.pth").write_text(lines, encoding="utf-8")
    return python


def test_a_scaffold_installs_with_pip_into_a_venv_and_its_own_tests_pass(
    tmp_path: Path, fake_site, capsys: pytest.CaptureFixture[str]
) -> None:
    scaffold = new_plugin("my_attention", "attention", tmp_path / "gptzoo-my-attention")
    python = _venv(tmp_path / "venv")
    allow("gptzoo-my-attention")
    env = {k: v for k, v in os.environ.items() if k not in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "COLUMNS")}
    env.update(PYTHONPATH=str(REPO), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

    def run(*argv: str) -> str:
        done = subprocess.run(argv, cwd=scaffold.directory, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run(str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ".")
    summary = json.loads(
        run(str(python), "-m", "gptzoo", "build", "gpt2-tiny", "--set", "model.attention=my_attention", "--json")
    )
    [attention] = [c for c in summary["components"] if c["kind"] == "attention"]
    assert {k: attention[k] for k in ("name", "plugin", "distribution", "version")} == {
        "name": "my_attention",
        "plugin": "gptzoo_my_attention",
        "distribution": "gptzoo-my-attention",
        "version": "0.1.0",
    }
    report = run(str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert importlib.util.find_spec("gptzoo_my_attention") is None  # pip installed into the venv only

    install_project(fake_site, scaffold.directory)  # here too: the README's `gptzoo plugins --check` counts them
    assert main(["plugins", "--check", "gptzoo-my-attention", "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert (checked["components"], checked["failed"]) == (1, 0)
    assert re.fullmatch(rf"{len(checked['results'])} passed in [\d.]+s", report.splitlines()[-1]), report


def test_the_command_writes_the_package_and_says_what_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new-plugin", "ring_window", "--kind", "attention"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "wrote gptzoo-ring-window: pyproject.toml, README.md, gptzoo_ring_window.py, tests/test_ring_window.py",
        "next: cd gptzoo-ring-window && pip install -e . && python -m pytest",
    ]
    pyproject = (tmp_path / "gptzoo-ring-window" / "pyproject.toml").read_text(encoding="utf-8")
    assert '\nname = "gptzoo-ring-window"\n' in pyproject
    assert '\n[project.entry-points.gptzoo]\nring_window = "gptzoo_ring_window"\n' in pyproject

    assert main(["new-plugin", "top_eta", "--kind", "sampler", "--out", "deep/er/eta", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "directory": "deep/er/eta",
        "kind": "sampler",
        "name": "top_eta",
        "module": "gptzoo_top_eta",
        "distribution": "gptzoo-top-eta",
        "files": ["pyproject.toml", "README.md", "gptzoo_top_eta.py", "tests/test_top_eta.py"],
        "next": "cd deep/er/eta && pip install -e . && python -m pytest",
    }
    readme = (tmp_path / "gptzoo-ring-window" / "README.md").read_text(encoding="utf-8")
    assert "\n    gptzoo plugins --check gptzoo-ring-window     # the same checks, as a table\n" in readme
    assert "--top-eta, placed after min_p" in (tmp_path / "deep/er/eta/gptzoo_top_eta.py").read_text(encoding="utf-8")


RULE = (
    "use lowercase letters, digits and '_', starting with a letter and ending with a letter or digit, at most "
    "64 characters (e.g. 'ring_window'), since it names the component, the module gptzoo_NAME and the "
    "distribution gptzoo-NAME"
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["Ring-Window", "--kind", "attention"],
            f"'Ring-Window' is not a plugin name: {RULE}; did you mean 'ring_window'?",
        ),
        (["2window", "--kind", "attention"], f"'2window' is not a plugin name: {RULE}"),
        (["window_", "--kind", "attention"], f"'window_' is not a plugin name: {RULE}; did you mean 'window'?"),
        (["w" * 65, "--kind", "norm"], f"'{'w' * 65}' is not a plugin name: {RULE}"),
        (["tab\tname", "--kind", "norm"], f"'tab\\tname' is not a plugin name: {RULE}; did you mean 'tab_name'?"),
        (
            ["x", "--kind", "norm", "--out", "taken"],
            "taken already exists; give --out a new directory, or remove that one",
        ),
        (
            ["x", "--kind", "norm", "--out", "empty"],
            "empty already exists; give --out a new directory, or remove that one",
        ),
        (["x", "--kind", "norm", "--out", "a-file/x"], "cannot write to a-file/x: a-file is a file, not a directory"),
    ],
)
def test_bad_input_is_one_message_and_nothing_is_written(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    before = _tree(tmp_path)
    for json_flag in ([], ["--json"]):
        assert run_error(capsys, "new-plugin", *argv, *json_flag) == f"error: {message}"
    assert _tree(tmp_path) == before
    assert (tmp_path / "taken" / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_an_unknown_kind_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    message = run_error(capsys, "new-plugin", "x", "--kind", "attn")
    choices = ", ".join(repr(kind) for kind in KINDS)
    assert message.endswith(
        f"gptzoo new-plugin: error: argument --kind: invalid choice: 'attn' (choose from {choices})"
    )
    with pytest.raises(gptzoo.GptzooError) as info:
        new_plugin("x", "nrom")
    assert str(info.value) == f"unknown component kind 'nrom'; did you mean 'norm'? (available: {', '.join(KINDS)})"
    assert _tree(tmp_path) == []


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    written: list[str] = []
    write_text = Path.write_text

    def full_disk(self: Path, text: str, **kwargs: object) -> int:
        if self.name == OWNER:  # the writer's own pid file, not the project's
            return write_text(self, text, **kwargs)
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        written.append(self.name)
        return write_text(self, text, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    message = run_error(capsys, "new-plugin", "x", "--kind", "norm", "--out", "new/plugin")
    assert message == "error: cannot write to new/plugin: the disk is full (No space left on device)"
    assert written == ["pyproject.toml", "README.md"] and _tree(tmp_path) == []


def test_a_name_taken_for_that_kind_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    taken = next(e for e in gptzoo.get_registry().entries("norm") if PLUGIN_NAME.fullmatch(e.name))
    assert run_error(capsys, "new-plugin", taken.name, "--kind", "norm") == (
        f"error: norm {taken.name!r} is already registered by {taken.provenance}: choose another name for the new "
        "plugin (`gptzoo list norm` shows the names taken)"
    )
    assert _tree(tmp_path) == []

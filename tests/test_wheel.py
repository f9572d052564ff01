"""The package as a user installs it: a wheel built from this tree and installed into a fresh virtual
environment (its dependencies read from this one's site-packages) carries every module of gptzoo/,
plugins/ and recipes/, and runs `gptzoo build gpt2-small`, `gptzoo recipes` and the shipped sweeps'
listing from there, with the built-in plugins imported from the environment, not from this tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SOURCES = {"gptzoo": "gptzoo", "plugins": "gptzoo_plugins", "recipes": "gptzoo_recipes"}
"""Folder of this tree -> the import name it installs as."""


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh environment's python)."""
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "src"
    files = run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=REPO).splitlines()
    for name in files:
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        root / "dist",
        tree,
        cwd=root,
    )
    (wheel,) = (root / "dist").glob("gptzoo-*.whl")
    venv = root / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., not gptzoo
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=root)
    return wheel, python


def test_the_wheel_carries_every_module_and_recipe(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in SOURCES.items():
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".toml", ".c", ".h") and "__pycache__" not in path.parts:
                inside = f"{package}/{path.relative_to(REPO / folder).as_posix()}"
                assert inside in names, f"the wheel lacks {inside} ({path.relative_to(REPO)})"
    assert not [n for n in names if n.split("/")[0] in ("plugins", "recipes", "tests")]


def test_the_installed_wheel_builds_lists_recipes_and_sweeps(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, python = installed
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPTZOO_NO_PLUGINS": "1"}
    where = run(
        python,
        "-c",
        "import gptzoo, gptzoo_plugins, gptzoo_recipes; print(gptzoo_plugins.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert Path(where.strip()).is_relative_to(python.parents[1]), where
    gptzoo = python.parent / "gptzoo"
    assert "124,439,808" in run(gptzoo, "build", "gpt2-small", cwd=tmp_path, env=env)
    recipes = run(gptzoo, "recipes", "--json", cwd=tmp_path, env=env)
    assert '"gpt2-small"' in recipes and '"smollm2-135m"' in recipes
    sweeps = run(gptzoo, "sweep", "--help", cwd=tmp_path, env=env)
    assert all(name in sweeps for name in ("norm-placement", "activation", "position", "attention")), sweeps

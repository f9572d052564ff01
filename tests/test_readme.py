"""README.md tells the truth: its Python example runs as written, and its layout table lists the
package's folders and modules as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    section = README[README.index("## Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)  # data/ and runs/ go to a fresh directory
    exec(compile(code, "README.md", "exec"), {})
    steps, text = capsys.readouterr().out.splitlines()[-2:]
    assert re.fullmatch(r"20 steps, val loss \d\.\d\d", steps), steps
    assert re.fullmatch(r"'.*' (length|eos)", text), text
    assert (tmp_path / "runs/docs/checkpoints/step-000020/model.safetensors").is_file()


def _layout_paths() -> list[str]:
    table = README[README.index("## Where things live") :]
    return [p for row in re.findall(r"^\| (.*?) \|", table, re.M) for p in re.findall(r"`([^`]+)`", row)]


def test_the_layout_table_matches_the_package() -> None:
    listed = set(_layout_paths())
    for path in listed:
        assert (REPO / path).exists(), f"README lists {path}, which does not exist"
    package = REPO / "gptzoo"
    expected = {f"gptzoo/{p.name}/" for p in package.iterdir() if p.is_dir() and not p.name.startswith("__")}
    expected |= {f"gptzoo/{p.name}" for p in package.glob("*.py") if p.name != "__main__.py"}
    assert sorted(expected - listed) == [], "README's layout table misses these"


def test_the_layout_table_names_every_module_of_each_folder() -> None:
    """A folder's row names each of its modules (``engine.py``), so that a newcomer finds where a thing lives."""
    table = README[README.index("## Where things live") :]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(gptzoo/[a-z_]+/)` \|.*$", table, re.M)}
    missing = []
    for folder, row in rows.items():
        named = set(re.findall(r"`([\w/]+\.py)`", row)) | set(re.findall(r"([\w/]+\.py)", row))
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder).as_posix()
            if path.name == "__init__.py" or relative in named or path.name in named:
                continue
            missing.append(folder + relative)
    assert missing == [], "README's layout table names no row for these modules"


def test_the_test_folders_mirror_the_package() -> None:
    tests = REPO / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    homes = {p.name for p in (REPO / "gptzoo").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert sorted(folders - homes - {"plugins"}) == [], "tests/ has folders that name no folder of the package"
    assert list(tests.glob("*/__init__.py")) == []  # module names stay unique: pytest imports by basename


def test_the_sweep_example_has_a_quick_budget(tmp_path: Path) -> None:
    """The README's example spec as written: the base and one swap, each at two learning rates, so its report
    compares something; 4 runs of 400 steps of 1,024 tokens, each scored on the first
    16,384 tokens of the val split (EVAL_TOKENS, the default it does not set) at each of its 3 lengths, not on
    the whole split (500k tokens of Shakespeare, which took minutes a run)."""
    from gptzoo.registry import default_registry
    from gptzoo.sweep.runner import tasks, tokens_per_step
    from gptzoo.sweep.spec import EVAL_TOKENS, read_spec

    section = README[README.index("`gptzoo sweep SPEC` trains") :]
    (tmp_path / "my-sweep.toml").write_text(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    spec = read_spec(tmp_path / "my-sweep.toml")
    runs = tasks(spec, tmp_path / "out", tmp_path / "data", default_registry())
    assert [(t.variant, t.seed) for t in runs] == [
        (f"{v}+lr={lr}", 0) for v in ("gelu_tanh", "swiglu") for lr in ("0.0003", "0.003")
    ]
    assert runs[0].recipe.model.activation.name == "gelu_tanh"  # the base row, the swap read against it
    assert {(t.recipe.train.max_steps, tokens_per_step(t.recipe)) for t in runs} == {(400, 1024)}
    assert {(t.eval_max_tokens, t.eval_lengths) for t in runs} == {(EVAL_TOKENS, (128, 256, 512))}
    assert EVAL_TOKENS == 16384

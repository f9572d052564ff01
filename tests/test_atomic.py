"""gptzoo.atomic: a new directory appears whole, with the permissions of a plain mkdir, or not at all,
and a failed write leaves nothing behind, not even the parent directories it made."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gptzoo.atomic import OWNER, check_new_directory, new_directory, temporary_prefix
from gptzoo.errors import CheckpointError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_directory_and_its_files_get_plain_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        with new_directory(tmp_path / "a" / "b") as tmp:
            (tmp / "f").write_bytes(b"x")
            os.chmod(tmp / "f", 0o600)  # as safetensors and mkstemp leave their files
        assert _mode(tmp_path / "a" / "b") == 0o750 and _mode(tmp_path / "a" / "b" / "f") == 0o640
    finally:
        os.umask(umask)


def test_an_empty_directory_is_filled_keeping_its_permissions(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir(mode=0o711)
    os.chmod(tmp_path / "out", 0o711)
    with new_directory(tmp_path / "out") as tmp:
        (tmp / "f").write_bytes(b"x")
    assert _mode(tmp_path / "out") == 0o711 and (tmp_path / "out" / "f").read_bytes() == b"x"


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_leaves_nothing_not_even_new_parents(tmp_path: Path, error: BaseException) -> None:
    (tmp_path / "kept").mkdir()
    with pytest.raises(CheckpointError if isinstance(error, OSError) else KeyboardInterrupt):
        with new_directory(tmp_path / "kept" / "new" / "deeper" / "out") as tmp:
            (tmp / "f").write_bytes(b"x")
            raise error
    assert list((tmp_path / "kept").iterdir()) == []


def test_what_cannot_become_a_new_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    cases = {
        tmp_path
        / "file": f"{tmp_path / 'file'} already exists and is not an empty directory; choose another one or remove it",
        tmp_path
        / "full": f"{tmp_path / 'full'} already exists and is not an empty directory; choose another one or remove it",
        tmp_path / "link": f"{tmp_path / 'link'} is a symbolic link; give the directory it should be, or another name",
        tmp_path
        / "file"
        / "sub"
        / "x": f"cannot write to {tmp_path / 'file' / 'sub' / 'x'}: {tmp_path / 'file'} is a file, not a directory",
        tmp_path / ("a" * 300): f"cannot write to {tmp_path / ('a' * 300)}: File name too long",
    }
    for out, message in cases.items():
        with pytest.raises(CheckpointError) as info:
            check_new_directory(out)
        assert str(info.value) == message
    assert (tmp_path / "file").read_text(encoding="utf-8") == "mine" and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("name", ["a" * 255, "é" * 127 + "a", "step-000200"])
def test_names_up_to_the_limit_get_a_temporary_sibling_that_fits(tmp_path: Path, name: str) -> None:
    with new_directory(tmp_path / name) as tmp:
        assert len(os.fsencode(tmp.name)) <= 255 and tmp.name.startswith(temporary_prefix(name))
        assert temporary_prefix(name).startswith(f".{name[:100]}")  # run_dir finds leftover ".step-*" by it
        (tmp / "f").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_build_writes_a_checkpoint_of_a_250_character_name(tmp_path: Path) -> None:
    from gptzoo.cli import main

    out = tmp_path / ("c" * 250)
    assert main(["build", "gpt2-tiny", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "recipe.toml"]


def test_a_killed_write_s_temporary_directory_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL leaves the hidden temporary directory of a write; the next write to that name removes it when
    its writer is gone, and leaves alone one whose writer runs (a write in progress) and one it did not make."""
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    out = tmp_path / "hf"
    abandoned, running, foreign = (tmp_path / f"{temporary_prefix('hf')}{s}" for s in ("aaaaaaaa", "bbbbbbbb", "c" * 8))
    for directory, writer in ((abandoned, killed.pid), (running, os.getpid()), (foreign, None)):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"partial")
        if writer is not None:
            (directory / OWNER).write_text(str(writer))
    with new_directory(out) as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["hf", running.name, foreign.name])
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # the writer's mark is gone


def test_a_file_too_large_to_write_says_so(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as raised, new_directory(tmp_path / "out"):
        raise OSError(errno.EFBIG, "File too large")
    assert str(raised.value) == (
        f"cannot write to {tmp_path / 'out'}: a file would be larger than this system lets it be (File too large: a "
        "`ulimit -f` limit, or a drive such as FAT32's of at most 4 GiB a file)"
    )

"""What the `gptzoo` process writes, run as a user runs it (a subprocess): with --json stdout holds one
document whatever else writes to it, errors reach a full or closed output as they should, the terminal's
settings cannot hide or break a message, and Ctrl-C after the work leaves at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fakedist import FakeSite

NOISY = """
import atexit, os, subprocess, sys, threading

os.write(1, b"a plugin writing to file descriptor 1\\n")
print("a plugin printing to sys.__stdout__", file=sys.__stdout__, flush=True)
subprocess.run([sys.executable, "-c", "print('a subprocess of a plugin')"])
atexit.register(lambda: print("a plugin printing at exit", flush=True))
threading.Thread(target=lambda: print("a plugin's thread", flush=True)).start()
"""


def gptzoo(*args: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gptzoo", *args], capture_output=True, text=True, timeout=300, env=env, **kwargs
    )


def test_json_stdout_is_one_document_whatever_writes_to_it(tmp_path: Path) -> None:
    site = FakeSite(tmp_path / "site")
    site.add("noisy", "gptzoo_fake_noisy", NOISY)
    done = gptzoo("list", "norm", "--json", env=site.env())
    assert done.returncode == 0 and [row["kind"] for row in json.loads(done.stdout)] == ["norm"] * len(
        json.loads(done.stdout)
    )
    for line in ("file descriptor 1", "sys.__stdout__", "a subprocess of a plugin", "at exit", "thread"):
        assert line in done.stderr
    done = gptzoo("build", "nosuch", "--json", env=site.env())
    assert done.returncode == 2 and json.loads(done.stdout)["exit"] == 2


def test_an_error_document_on_a_full_or_closed_stdout() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gptzoo", "build", "nosuch", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 2 and done.stderr.endswith("error: cannot write the output: No space left on device\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptzoo", "build", "nosuch", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.close()  # `| true`: nobody reads
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and b"Traceback" not in err
    closed = subprocess.run(
        [sys.executable, "-c", "import os, sys; os.close(1); sys.argv = ['gptzoo', 'recipes']; "
         "sys.stdout = None; from gptzoo.__main__ import main; sys.exit(main())"],
        capture_output=False, stdout=None, stderr=subprocess.PIPE, text=True, timeout=300,
    )  # fmt: skip
    assert (closed.returncode, closed.stderr) == (
        2,
        "error: standard output is closed; give the command somewhere to write\n",
    )


def test_the_environment_cannot_hide_or_break_a_message(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "0", "LINES": "-3", "RANK": "abc"}
    done = gptzoo("build", "nosuch", env=env)
    assert done.returncode == 2 and done.stderr.startswith("error: nosuch: unknown recipe 'nosuch'")
    done = gptzoo("train", "gpt2-tiny", "--data", str(tmp_path / "none"), "--json", env=env)
    assert done.returncode == 2 and json.loads(done.stdout)["error"].startswith("no prepared data at ")
    done = gptzoo("build", "nosuch", "--json", env={**os.environ, "RANK": "1"})  # a shell-out from a torchrun worker
    assert done.returncode == 2 and json.loads(done.stdout)["exit"] == 2
    recipe = tmp_path / "café.toml"
    recipe.write_text('extends = "gpt2-tiny"\ndescription = "café \\u00e9t\\u00e9 \\u2603"\n', encoding="utf-8")
    done = gptzoo("build", str(recipe), env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and "caf\\xe9 \\xe9t\\xe9 \\u2603" in done.stdout
    undecodable = tmp_path / "x\udcff.toml"
    undecodable.write_text('extends = "gpt2-tiny"\n', encoding="utf-8")
    done = gptzoo("build", str(undecodable), env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert done.returncode == 0 and "x\\udcff.toml" in done.stdout
    done = gptzoo("list", "norm", env={**os.environ, "GPTZOO_PLUGIN_WARN_S": "1e300"})  # more than a timer waits
    assert (done.returncode, done.stderr) == (0, "")


def test_a_debug_traceback_is_escaped_too(tmp_path: Path) -> None:
    done = gptzoo("build", "\x1b]0;title\x07", "--debug")
    assert done.returncode == 2 and "Traceback (most recent call last):" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr and "\\x1b]0;title\\x07" in done.stderr


def test_ctrl_c_after_the_work_leaves_at_once_with_its_status(tmp_path: Path) -> None:
    site = FakeSite(tmp_path / "site")
    site.add(
        "lingering",
        "gptzoo_fake_lingering",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptzoo", "recipes", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=site.env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the document's first line: the command has run
    assert line == b"[\n"
    time.sleep(1.0)  # the interpreter now waits for the plugin's thread
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0  # the thread had 59 more seconds to sleep
    assert isinstance(json.loads(line + proc.stdout.read()), list)

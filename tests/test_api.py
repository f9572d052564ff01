"""The public Python API: every name resolves, and `import gptzoo` stays light (no torch) until one is used;
the command's entry point answers Ctrl-C while torch is still loading."""

from __future__ import annotations

import importlib
import subprocess
import sys

import gptzoo


def test_every_public_name_resolves_to_its_module() -> None:
    for name in gptzoo.__all__:
        assert getattr(gptzoo, name) is getattr(importlib.import_module(gptzoo._API[name]), name)
    assert gptzoo.__version__ == gptzoo.gptzoo_version()
    assert gptzoo.registry.default_registry is gptzoo.get_registry.__globals__["default_registry"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_gptzoo_imports_no_torch() -> None:
    done = _python("import sys, gptzoo; gptzoo.hookimpl; gptzoo.GptzooError; print('torch' in sys.modules)")
    assert (done.returncode, done.stdout) == (0, "False\n")


def test_ctrl_c_while_the_command_line_loads() -> None:
    code = """
import builtins, sys
real = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "gptzoo.cli":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
sys.argv = ["gptzoo", "build", "gpt2-tiny", "--json"]
from gptzoo.__main__ import main
sys.exit(main())
"""
    done = _python(code)
    assert (done.returncode, done.stderr) == (130, "interrupted: nothing was done\n")
    assert done.stdout == '{\n  "error": "interrupted: nothing was done",\n  "exit": 130\n}\n'

"""Fake installed distributions for plugin tests: a directory with ``NAME-VERSION.dist-info``.

A directory on sys.path holding ``NAME-VERSION.dist-info/METADATA`` and ``entry_points.txt`` is
an installed distribution as far as importlib.metadata is concerned, so gptzoo finds its entry
points exactly as it finds those of a real ``pip install``. The plugin module sits next to it.

In-process tests use the ``fake_site`` fixture of test_plugins.py, which puts the directory on
sys.path with monkeypatch and removes the plugin modules from sys.modules afterwards; subprocess
tests point PYTHONPATH at the directory (see :func:`FakeSite.env`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

PLUGIN_HEADER = "import gptzoo\n\n"
"""Every fake plugin module starts with this (its hooks are decorated with @gptzoo.hookimpl)."""


class FakeSite:
    """A site directory of fake distributions, each with one entry point in group ``gptzoo``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.modules: list[str] = []

    def add(self, entry_name: str, module: str, source: str, *, dist: str | None = None, version: str = "1.0") -> str:
        """Write a distribution whose entry point ``entry_name`` loads ``module`` (given its source).

        The distribution is named ``gptzoo-fake-<entry_name>`` unless ``dist`` says otherwise.
        Returns the distribution name.
        """
        dist = dist or f"gptzoo-fake-{entry_name}"
        info = self.root / f"{re.sub(r'[-_.]+', '_', dist)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
        (info / "entry_points.txt").write_text(f"[gptzoo]\n{entry_name} = {module}\n", encoding="utf-8")
        (self.root / f"{module}.py").write_text(PLUGIN_HEADER + textwrap.dedent(source).lstrip(), encoding="utf-8")
        self.modules.append(module)
        importlib.invalidate_caches()
        return dist

    def forget_modules(self) -> None:
        """Drop the fake plugin modules from sys.modules (so no later test sees a stale one)."""
        for module in self.modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """An environment for a subprocess that sees these distributions (plus ``extra`` variables)."""
        env = dict(os.environ if base is None else base)
        for var in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "COLUMNS"):  # COLUMNS: rich's width
            env.pop(var, None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root), env.get("PYTHONPATH", "")) if p)
        env.update(extra)
        return env


# --- plugin sources ------------------------------------------------------------------------------

SCALENORM = '''
import torch
from torch import nn


class ScaleNorm(nn.Module):
    """ScaleNorm: g * x / max(||x||, eps), one learned scalar g (Nguyen & Salazar, 2019)."""

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.tensor(float(dim) ** 0.5))

    def forward(self, x):
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)


@gptzoo.hookimpl
def register_norms(register):
    register("scalenorm", ScaleNorm)
'''
"""A good plugin: norm ``scalenorm``."""

BROKEN_MESSAGE = "boom: this plugin needs the frobnicator extension"
BROKEN = f"""
raise RuntimeError({BROKEN_MESSAGE!r})
"""
"""A plugin that raises on import."""

TYPO = """
@gptzoo.hookimpl
def register_norm(register):  # should be register_norms
    register("typonorm", object)
"""
"""A plugin with a misspelled hook name."""

BAD_SIGNATURE = """
@gptzoo.hookimpl
def register_activations(reg):  # the hookspec's argument is called `register`
    reg("badsig", object)
"""
"""A plugin whose hook takes an argument the hookspec does not have."""


def rmsnorm_replacement(*, override: bool) -> str:
    """A plugin registering norm ``rmsnorm`` again (a duplicate of the built-in, or an override)."""
    return f'''
from torch import nn


class MyRMSNorm(nn.Module):
    """A replacement RMSNorm (same signature as the built-in)."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return x


@gptzoo.hookimpl
def register_norms(register):
    register("rmsnorm", MyRMSNorm, override={override!r})
'''

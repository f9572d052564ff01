from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fakedist import FakeSite  # tests/ is on sys.path (pyproject: pythonpath)

import gptzoo
from gptzoo.plugin_manager import ONLY_PLUGINS_ENV

SUITE_PLUGINS = "gptzoo-sqrelu"
"""The third-party distributions the suite loads: the example it installs (.ci/run, README), and each fake
one a test installs (tests/fakedist.py allows it). Whatever else is installed is not loaded, so the suite
does not depend on it; `gptzoo plugins --check` is what tests installed plugins."""
os.environ[ONLY_PLUGINS_ENV] = SUITE_PLUGINS
os.environ["GPTZOO_STATUS_S"] = "0"  # no status lines of slow steps: a loaded machine must not change the output


@pytest.fixture(scope="session")
def registry() -> gptzoo.Registry:
    return gptzoo.get_registry()


@pytest.fixture(scope="session")
def stdlib_bytes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python's documentation prepared as UTF-8 bytes (train.bin / val.bin / meta.json): a corpus that
    needs no download, for the tests that train."""
    from gptzoo.training.data import prepare

    return Path(prepare("stdlib-docs", tmp_path_factory.mktemp("data") / "docs", tokenizer="bytes")["out"])


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _suite_plugins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the suite's own distributions (a test's fake ones are allowed as it adds them)."""
    monkeypatch.setenv(ONLY_PLUGINS_ENV, SUITE_PLUGINS)


@pytest.fixture(autouse=True)
def _fresh_default_registry() -> None:
    """Tests install and remove plugins: the shared default registry must not outlive one test."""
    gptzoo.registry.default_registry.cache_clear()


@pytest.fixture(autouse=True)
def kept_freed_memory(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CPU training run sets malloc to keep freed memory for the rest of its process (host_memory): in the
    suite's one long process that would outlive the test, so each in-process run records the call here instead
    (tests/training/test_host_memory.py tests the real call in processes of their own)."""
    calls: list[str] = []
    monkeypatch.setattr("gptzoo.training.trainer.keep_freed_memory", lambda: bool(calls.append("kept")))
    return calls


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """A directory of fake plugin distributions on sys.path (in this process) for one test."""
    site = FakeSite(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site.root))
    importlib.invalidate_caches()
    yield site
    site.forget_modules()


@pytest.fixture
def no_real_exit(monkeypatch: pytest.MonkeyPatch) -> object:
    """os._exit replaced by a function that raises: a guard that failed to catch it fails the test
    instead of ending pytest; the guard must put this one back."""

    def forbidden(code: int) -> None:
        raise AssertionError(f"the real os._exit({code}) was reached")

    monkeypatch.setattr(os, "_exit", forbidden)
    return forbidden

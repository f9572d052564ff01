from __future__ import annotations

import pytest
import torch

import gptzoo


@pytest.fixture(scope="session")
def registry() -> gptzoo.Registry:
    return gptzoo.get_registry()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_default_registry() -> None:
    """Tests install and remove plugins: the shared default registry must not outlive one test."""
    gptzoo.registry.default_registry.cache_clear()

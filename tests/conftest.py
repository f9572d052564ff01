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

"""A picking sampler's pick is held to one possible token id per row: an id outside the vocabulary, or
at a logit the chain masked, is a PluginError naming the sampler and its plugin (exit 2 in generate),
and the conformance kit fails such a sampler with the same reason."""

from __future__ import annotations

import pytest
from cli_run import run_error
from fakedist import FakeSite

import gptzoo
from gptzoo.testing import run_conformance

PICKERS = """
import torch

import gptzoo
from gptzoo.interfaces import Sampler


class Beyond(Sampler):
    '''Picks one past the last token id.'''

    picks = True

    def pick(self, logits, generator=None):
        return torch.full((logits.shape[0],), logits.shape[-1], dtype=torch.long)


class Masked(Sampler):
    '''Picks the lowest logit, masked or not.'''

    picks = True

    def pick(self, logits, generator=None):
        return logits.argmin(dim=-1)


@gptzoo.hookimpl
def register_samplers(register):
    register("beyond", Beyond)
    register("masked", Masked)
"""
PLUGIN = "gptzoo_fake_pickers (gptzoo-fake-pickers 1.0)"


@pytest.fixture
def pickers(fake_site: FakeSite) -> FakeSite:
    fake_site.add("pickers", "gptzoo_fake_pickers", PICKERS)
    return fake_site


def test_generate_refuses_a_pick_outside_the_vocabulary(pickers: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    message = run_error(
        capsys, "generate", "gpt2-tiny", "--prompt", "hi", "--max-new-tokens", "2", "--sampler", "beyond", "--json"
    )
    assert message.endswith(
        f"sampler 'beyond' from {PLUGIN}: pick gave token 50257 for row 1, outside the vocabulary [0, 50257); "
        "return one possible token id per row from pick"
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("beyond", "pick gave token 64 for row 1, outside the vocabulary [0, 64)"),
        ("masked", "pick gave token 0 for row 1, whose logit the chain masked (-inf)"),
    ],
)
def test_the_kit_fails_a_sampler_whose_pick_is_not_a_possible_token(pickers: FakeSite, name: str, reason: str) -> None:
    registry = gptzoo.get_registry()
    (result,) = [r for r in run_conformance(registry, [registry.get("sampler", name)]) if r.check == "sampler"]
    assert (result.status, result.detail) == ("failed", reason)

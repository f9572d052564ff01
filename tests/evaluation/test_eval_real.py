"""`gptzoo eval` on real pretrained weights (SmolLM2-135M and Gemma 3 270M, fetched into the user cache as
the parity tests fetch them): perplexity on held-out text equals transformers' on the same windows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from gptzoo.evaluation import eval_model
from gptzoo.evaluation.texts import read_text_file
from gptzoo.evaluation.windows import windows
from gptzoo.hf import locate
from gptzoo.loader import load_any

pytestmark = pytest.mark.slow


def held_out_text() -> str:
    """Python's documentation of a few statements: text neither model was shown here."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in ("assert", "break", "continue", "del"))


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_perplexity_equals_transformers(tmp_path: Path, name: str) -> None:
    path = tmp_path / "held_out.txt"
    path.write_text(held_out_text(), encoding="utf-8")
    loaded = load_any(name)
    report = eval_model(loaded, texts=[path], lengths=[96], stride=48, max_tokens=400)
    score = report["scores"][0]
    ids = read_text_file(path, loaded.tokenizer(), max_tokens=400).documents[0].ids.tolist()
    hf = transformers.AutoModelForCausalLM.from_pretrained(locate(name), dtype=torch.float32).eval()
    total = 0.0
    for w in windows(len(ids), 96, 48):
        x = torch.tensor([ids[w.begin : w.begin + w.length + 1]])
        with torch.no_grad():
            logits = hf(x[:, :-1]).logits[0, -w.scored :]
        total += float(F.cross_entropy(logits.float(), x[0, -w.scored :], reduction="sum"))
    assert score["tokens"] == len(ids) - 1 == 399 and score["windows"] == 8
    assert score["perplexity"] == pytest.approx(math.exp(total / score["tokens"]), rel=1e-3)
    assert score["loss"] == pytest.approx(total / score["tokens"], rel=1e-4)
    assert 1.0 < score["perplexity"] < 100.0  # a real model reads English documentation well

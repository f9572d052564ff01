"""`gptzoo eval`: a model's loss, perplexity and bits per byte on held-out text, at several context
lengths (length extrapolation), with bootstrap intervals.

- gptzoo.evaluation.windows: the sliding windows over a long text;
- gptzoo.evaluation.texts: text files and prepared data as token documents with their bytes;
- gptzoo.evaluation.perplexity: the scores.

Example::

    from gptzoo.evaluation import eval_model
    report = eval_model("runs/shakespeare", data=["data/shakespeare-bytes"], lengths=[256, 512])
    report["scores"][0]["bits_per_byte"]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gptzoo.errors import GptzooError
from gptzoo.evaluation.perplexity import Progress, Score, evaluate
from gptzoo.evaluation.texts import EvalText, read_prepared, read_text_file
from gptzoo.loader import Loaded, load_any
from gptzoo.registry import Registry

DEFAULT_LONGEST = 1024
"""The default length is the model's context, at most this many tokens."""

__all__ = ["EvalText", "Score", "default_lengths", "eval_model", "evaluate", "texts_for"]


def default_lengths(loaded: Loaded) -> list[int]:
    return [min(loaded.recipe.model.context_length, DEFAULT_LONGEST)]


def texts_for(
    loaded: Loaded,
    *,
    texts: Sequence[str | Path] = (),
    data: Sequence[str | Path] = (),
    max_tokens: int | None = None,
    data_tokens: int | None | str = "max_tokens",
) -> list[EvalText]:
    """The files and prepared data to evaluate ``loaded`` on, in its tokenizer: the first ``max_tokens`` of
    each (None: all), of prepared data the first ``data_tokens`` (by default ``max_tokens``).

    Raises:
        GptzooError: neither given, or one that cannot be read (see gptzoo.evaluation.texts).
    """
    if not texts and not data:
        raise GptzooError("nothing to evaluate on: give --text FILE or --data DIR (prepared by `gptzoo prepare`)")
    tokenizer = loaded.tokenizer()
    cap = max_tokens if data_tokens == "max_tokens" else data_tokens
    out = [read_prepared(d, loaded.recipe, tokenizer, hf_dir=loaded.hf_dir, max_tokens=cap) for d in data]
    out += [read_text_file(t, tokenizer, max_tokens=max_tokens) for t in texts]
    return out


def eval_model(
    model: str | Path | Loaded,
    *,
    texts: Sequence[str | Path] = (),
    data: Sequence[str | Path] = (),
    lengths: Sequence[int] | None = None,
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    data_tokens: int | None | str = "max_tokens",
    dtype: str | torch.dtype = "float32",
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    progress: Progress | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (a name gptzoo.loader.load_any takes, in the precision ``dtype`` with
    ``overrides``, or a loaded model) on ``texts`` and ``data`` (their first ``max_tokens``, and of ``data``
    the first ``data_tokens``: see :func:`texts_for`); JSON-ready: the model (``name``, by
    default the name given or where the loaded model's weights came from), where its weights came from,
    its precision, and one score per text and length."""
    loaded = (
        model if isinstance(model, Loaded) else load_any(model, overrides=overrides, registry=registry, dtype=dtype)
    )
    if name is None:
        name = str(model) if not isinstance(model, Loaded) else loaded.source
    sources = texts_for(loaded, texts=texts, data=data, max_tokens=max_tokens, data_tokens=data_tokens)
    chosen = list(lengths) if lengths else default_lengths(loaded)
    with torch.inference_mode():
        scores = evaluate(loaded.model, sources, chosen, stride=stride, batch_size=batch_size, progress=progress)
    return {
        "model": name,
        "recipe": loaded.recipe.name,
        "weights": loaded.source,
        "dtype": loaded.precision or str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
        "context_length": loaded.recipe.model.context_length,
        "max_positions": loaded.model.max_positions,
        "scores": [s.to_dict() for s in scores],
    }

"""Loss, perplexity and bits per byte of a model on texts, at several context lengths.

Each text is cut into sliding windows (gptzoo.evaluation.windows) of each length; windows of one
length are fed in batches and every target is scored once. Per text and length the result is the
mean loss in nats per token, its perplexity, and bits per byte (total nats / ln 2 / the UTF-8 bytes
the scored tokens stand for, so models with different tokenizers compare), each with a 95% interval
from a bootstrap over windows (1,000 resamples, seed 0: the same every run; bits per byte scale the
loss interval by the text's tokens per byte). A length beyond what the model's positions encode
(GPT.position_limit, e.g. a learned table) is refused with the reason, the others are still
evaluated; windows past the context the model was trained at (GPT.context_length) are scored, with
one GptzooWarning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gptzoo.errors import GptzooError, GptzooWarning
from gptzoo.evaluation.texts import EvalText
from gptzoo.evaluation.windows import Window, windows
from gptzoo.model.gpt import GPT

RESAMPLES = 1000
LOGITS_BUDGET = 1 << 26
"""Logits (elements) one batch may hold; sets the default batch size."""
MAX_BATCH = 32

Progress = Callable[[int, int], None]
"""Called with (windows done, windows in all)."""


@dataclass(frozen=True)
class Score:
    """One text at one length."""

    text: str
    length: int
    stride: int
    tokens: int = 0
    """Tokens scored."""
    bytes: int = 0
    windows: int = 0
    longest: int = 0
    """The longest window fed: less than ``length`` when the text is shorter."""
    loss: float | None = None
    loss_ci: tuple[float, float] | None = None
    perplexity: float | None = None
    perplexity_ci: tuple[float, float] | None = None
    bits_per_byte: float | None = None
    bits_per_byte_ci: tuple[float, float] | None = None
    refused: str | None = None
    """Why this length was not evaluated."""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def default_batch(length: int, vocab_size: int) -> int:
    return max(1, min(MAX_BATCH, LOGITS_BUDGET // max(1, length * vocab_size)))


def bootstrap(nll: np.ndarray, count: np.ndarray, seed: int = 0) -> tuple[float, float] | None:
    """The 95% percentile interval of sum(nll) / sum(count) over resampled windows; None for fewer than 2."""
    if len(nll) < 2:
        return None
    rng = np.random.default_rng(seed)
    ratios = np.empty(RESAMPLES)
    chunk = max(1, (1 << 22) // len(nll))  # resamples at a time: a few million picks in memory, however many windows
    for start in range(0, RESAMPLES, chunk):
        picks = rng.integers(0, len(nll), size=(min(chunk, RESAMPLES - start), len(nll)))
        ratios[start : start + len(picks)] = nll[picks].sum(axis=1) / count[picks].sum(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def _batches(plans: Sequence[list[Window]], batch_size: int) -> list[list[tuple[int, int, Window]]]:
    """(index, document, window) in batches of at most ``batch_size`` windows of one length."""
    by_length: dict[int, list[tuple[int, int, Window]]] = {}
    i = 0
    for d, plan in enumerate(plans):
        for w in plan:
            by_length.setdefault(w.length, []).append((i, d, w))
            i += 1
    return [rows[k : k + batch_size] for rows in by_length.values() for k in range(0, len(rows), batch_size)]


@torch.no_grad()
def window_losses(
    model: GPT,
    documents: Sequence[np.ndarray],
    plans: Sequence[list[Window]],
    *,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The summed loss (nats) and the scored count of every window, in ``plans``' order;
    ``progress`` is called with the windows done after each batch."""
    device = next(model.parameters()).device
    tensors = [torch.from_numpy(ids) for ids in documents]
    n = sum(len(plan) for plan in plans)
    nll, count = np.zeros(n), np.zeros(n, dtype=np.int64)
    for batch in _batches(plans, batch_size):
        keep = max(w.scored for _, _, w in batch)
        x = torch.stack([tensors[d][w.begin : w.begin + w.length] for _, d, w in batch]).to(device)
        logits = model(x, logits_to_keep=keep).float()  # (B, keep, V)
        for j, (i, d, w) in enumerate(batch):
            end = w.begin + w.length
            targets = tensors[d][end - w.scored + 1 : end + 1].to(device)
            nll[i] = float(F.cross_entropy(logits[j, keep - w.scored :], targets, reduction="sum"))
            count[i] = w.scored
        if progress is not None:
            progress(len(batch))
    return nll, count


def _interval(ci: tuple[float, float] | None, f: Callable[[float], float]) -> tuple[float, float] | None:
    return (f(ci[0]), f(ci[1])) if ci is not None else None


def evaluate(
    model: GPT,
    texts: Sequence[EvalText],
    lengths: Sequence[int],
    *,
    stride: int | None = None,
    batch_size: int | None = None,
    progress: Progress | None = None,
) -> list[Score]:
    """One :class:`Score` per text and length (texts outer), with ``model`` in eval mode.

    Args:
        stride: tokens between window starts (default: half of each length); at most the shortest length.
        batch_size: windows per forward (default: as many as keep the logits within LOGITS_BUDGET, at most 32).
        progress: called with (windows done, windows in all).
    """
    model.eval()
    vocab = model.wte.weight.shape[0]
    if stride is not None and stride > min(lengths):
        raise GptzooError(f"--stride {stride} is longer than the length {min(lengths)}; give a stride <= every length")
    todo: list[tuple[int, EvalText, list[list[Window]]]] = []  # (its score's index, the text, its windows)
    scores: list[Score] = []
    for text in texts:
        for length in lengths:
            step = stride if stride is not None else max(1, length // 2)
            refused = model.too_long(length, f"length {length}", f"evaluate at {model.max_positions} or fewer")
            if refused is not None:
                scores.append(Score(text.name, length, step, refused=refused))
                continue
            todo.append((len(scores), text, [windows(len(doc.ids), length, step) for doc in text.documents]))
            scores.append(Score(text.name, length, step))
    total = sum(len(plan) for *_, plans in todo for plan in plans)
    longest = max((w.length for *_, plans in todo for plan in plans for w in plan), default=0)
    warning = model.past_context(longest)
    if warning is not None:
        warnings.warn(warning, GptzooWarning, stacklevel=1)  # one place: shown once
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    for k, text, plans in todo:
        length, step = scores[k].length, scores[k].stride
        size = batch_size if batch_size is not None else default_batch(length, vocab)
        nll, count = window_losses(model, [d.ids for d in text.documents], plans, batch_size=size, progress=advance)
        tokens, n_bytes = int(count.sum()), sum(d.n_bytes for d in text.documents)
        loss = float(nll.sum() / tokens)
        ci = bootstrap(nll, count.astype(np.float64))
        per_byte = tokens / n_bytes / math.log(2) if n_bytes else None
        scores[k] = Score(
            text.name,
            length,
            step,
            tokens=tokens,
            bytes=n_bytes,
            windows=len(nll),
            longest=max((w.length for plan in plans for w in plan), default=0),
            loss=loss,
            loss_ci=ci,
            perplexity=math.exp(min(loss, 700.0)),
            perplexity_ci=_interval(ci, lambda v: math.exp(min(v, 700.0))),
            bits_per_byte=loss * per_byte if per_byte is not None else None,
            bits_per_byte_ci=_interval(ci, lambda v, k=per_byte: v * k) if per_byte is not None else None,
        )
    return scores


def nothing_scored(model: GPT, scores: Sequence[dict[str, Any]]) -> str | None:
    """Why an evaluation whose every requested length was refused is no result (the command that asked
    for it fails with this); None when a score stands. Only the command decides: a sweep keeps a run's
    refused lengths in its report."""
    if not scores or any(s["refused"] is None for s in scores):
        return None
    refused = sorted({s["length"] for s in scores})
    named = "length" if len(refused) == 1 else "lengths " + ", ".join(map(str, refused[:-1])) + " and"
    return (
        f"no requested length can be scored: {named} {refused[-1]} {'is' if len(refused) == 1 else 'are'} longer "
        f"than {model.position_limit}; evaluate at {model.max_positions} or fewer (--lengths)"
    )

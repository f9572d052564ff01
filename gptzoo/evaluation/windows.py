"""Sliding windows over a long text: every token after the first is predicted exactly once, each with
as much context as the window length allows (transformers' perplexity guide, strided).

A window feeds ``length`` tokens ``ids[begin : begin + length]`` and scores the predictions of the
targets ``ids[first .. begin + length]`` (the target ``t`` is predicted from ``ids[:t]``'s last
tokens inside the window). Windows start ``stride`` tokens apart; each scores only the targets that
no earlier window scored, so after the first window every scored token had at least
``length - stride`` tokens of context. The last window is moved back to end at the text's end, so
every window of a text longer than ``length`` is full (and windows batch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    begin: int
    """The first token fed."""
    length: int
    """Tokens fed: ``ids[begin : begin + length]``."""
    scored: int
    """How many of its last predictions count: targets ``begin + length - scored + 1 .. begin + length``."""


def windows(n_tokens: int, length: int, stride: int) -> list[Window]:
    """The windows over a text of ``n_tokens`` tokens; their ``scored`` sum to ``n_tokens - 1``.

    Raises:
        ValueError: ``length`` or ``stride`` below 1, or ``stride`` above ``length``.
    """
    if length < 1 or not 1 <= stride <= length:
        raise ValueError(f"need 1 <= stride <= length, got length={length}, stride={stride}")
    targets = n_tokens - 1
    if targets < 1:
        return []
    if targets <= length:
        return [Window(0, targets, targets)]
    out: list[Window] = []
    done = 0  # targets 1 .. done are scored
    begin = 0
    while done < targets:
        begin = min(begin, targets - length)  # the last window ends at the text's end
        end = begin + length  # the last target this window predicts
        out.append(Window(begin, length, end - done))
        done = end
        begin += stride
    return out

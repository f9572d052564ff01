"""Values from outside (names, paths, flags, plugins' messages) as a message shows them."""

from __future__ import annotations

from rich.markup import escape

from gptzoo.errors import terminal_text


def text(value: object) -> str:
    """Text from outside (a name, a path, a plugin's message) for a rich line: markup and control
    characters escaped."""
    return escape(terminal_text(str(value)))


def cut(text: str) -> str:
    """A flag's value for a message, long values cut."""
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def few(names: list[str], n: int = 3) -> str:
    """``a, b, c +2``: the first n names and how many more."""
    return ", ".join(names[:n]) + (f" +{len(names) - n}" if len(names) > n else "")

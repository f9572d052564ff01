"""User-facing errors.

Every error a person can cause by what they typed or wrote (a recipe, a flag, a plugin they
installed) is a :class:`GptzooError`. The CLI prints its message on stderr and exits with status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable, Sequence


class GptzooError(Exception):
    """Base class of every error caused by user input; the message names the culprit and the fix."""

    multiline = False
    """The message is laid out on several lines by gptzoo itself (its parts escaped); otherwise it is one line."""


class PluginError(GptzooError):
    """A plugin failed to load or registered something invalid (fatal in strict mode)."""


class GptzooWarning(UserWarning):
    """Something a person should know but that does not stop the command (a plugin written against an
    older contract, a bare name that a built-in and a plugin both register); the CLI prints each once on
    stderr as ``warning: ...``."""


class RegistryError(GptzooError):
    """A registration conflicts with another one (duplicate name without ``override=True``)."""


MAX_LISTED = 20
"""The most names an 'unknown name' message lists; it counts the others."""


class ComponentLookupError(RegistryError):
    """A component name that does not name exactly one registered component."""

    kind: str
    name: str


class UnknownComponentError(ComponentLookupError):
    """A component name that no loaded plugin registered. ``reason``, when gptzoo knows why (the plugin
    that would register it failed to load, the checkpoint's distribution is not installed), is the
    whole message; otherwise it lists what is available, then ``note``."""

    def __init__(
        self, kind: str, name: str, available: Iterable[str], *, more: str = "", note: str = "", reason: str = ""
    ) -> None:
        self.kind, self.name, self.available = kind, name, sorted(available)
        super().__init__(reason or f"unknown {kind} {name!r}{did_you_mean(name, self.available, more=more)}{note}")


class AmbiguousComponentError(ComponentLookupError):
    """A bare name that several third-party distributions register: only their qualified names work."""

    def __init__(self, kind: str, name: str, origins: Sequence[tuple[str, str]]) -> None:
        """``origins``: (distribution, version) of each entry of that name, in registration order."""
        self.kind, self.name, self.origins = kind, name, list(origins)
        who = [f"{dist} {version}" for dist, version in self.origins]
        qualified = [repr(f"{dist}:{name}") for dist, _ in self.origins]
        both = "both" if len(who) == 2 else "all"
        super().__init__(f"{kind} {name!r} is ambiguous: {_and(who)} {both} register it; write {_and(qualified, 'or')}")


def _and(items: Sequence[str], word: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


class RecipeError(GptzooError):
    """A recipe with one or more problems; all of them are reported at once."""

    multiline = True

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source, self.problems = source, list(problems)
        if len(self.problems) == 1:
            text = f"{terminal_text(source)}: {terminal_text(self.problems[0])}"
        else:
            lines = "\n".join(f"  - {terminal_text(p)}" for p in self.problems)
            text = f"{terminal_text(source)}: {len(self.problems)} problems\n{lines}"
        super().__init__(text)


class ParameterError(GptzooError):
    """A component's factory refused the values the recipe gave it (it raised ValueError, as the
    contracts say it does for an out-of-range parameter)."""


class CheckpointError(GptzooError):
    """A checkpoint that cannot be written or read as asked."""


class DownloadError(GptzooError):
    """A download that failed, with the tail of the downloader's own output on the lines below."""

    multiline = True


def terminal_text(text: str, *, lines: bool = False) -> str:
    """``text`` safe to print as a message: control and format characters (escape sequences, carriage
    returns, newlines unless ``lines``) and lone surrogates (undecodable bytes of a file name) written
    as escapes, so a name from a file or a command line can neither move the cursor nor split the
    message, and every terminal encoding can show it."""
    return "".join(
        ch
        if (ch == "\n" and lines) or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp")
        else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def _str(exc: BaseException) -> tuple[str, bool]:
    """``(str(exc), True)``, or, when its ``__str__`` raises (or returns no str), ``(a description
    of it, False)``: its type name, what ``__str__`` raised and, if that works, its repr."""
    try:
        return str(exc), True
    except KeyboardInterrupt:
        raise
    except BaseException as err:
        shown = f"{type(exc).__name__} (its __str__ raised {type(err).__name__})"
    try:
        return f"{shown}: {repr(exc)}", False
    except KeyboardInterrupt:
        raise
    except BaseException:
        return shown, False


def safe_repr(value: object) -> str:
    """``repr(value)``, or ``<TYPE object>`` when its ``__repr__`` raises."""
    try:
        return repr(value)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return f"<{type(value).__name__} object>"


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, never raising (see :func:`_str` for an exception that cannot be printed)."""
    return _str(exc)[0]


def describe_exception(exc: BaseException) -> str:
    """Our own errors by their message; anything else (a plugin's bug) with its type, or by its type
    alone when it says nothing. Never raises, whatever the exception's ``__str__`` does."""
    text, printable = _str(exc)
    if not printable:
        return text
    if not text:
        return type(exc).__name__
    return text if isinstance(exc, GptzooError) else f"{type(exc).__name__}: {text}"


MAX_SUGGESTED = 4
"""How many of the closest names a did-you-mean lists."""

_SEPARATORS = str.maketrans("", "", "-_. :/")


def _normal(name: str) -> str:
    """A name as a person may misspell it: any case, separators (``gpt-2``, ``gpt_2``, ``gpt2``) dropped."""
    return name.casefold().translate(_SEPARATORS)


def _edits(a: str, b: str) -> list[int]:
    """Optimal string alignment distances from ``a`` to every prefix of ``b`` (insertions, deletions,
    substitutions and adjacent transpositions cost 1): entry j is the distance to ``b[:j]``."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev


def distance(name: str, candidate: str) -> tuple[int, int]:
    """How far ``name`` is from ``candidate``, separators and case aside: the edit distance, or one more
    than the distance to a beginning of ``candidate`` when that is closer (``gpt2`` is 1 from
    ``gpt2-small``, ``smolm2`` 2 from ``smollm2-135m``); then the whole edit distance, which breaks ties."""
    edits = _edits(_normal(name), _normal(candidate))
    return min(edits[-1], min(edits[:-1], default=edits[-1]) + 1), edits[-1]


def closest(name: str, available: Iterable[str], *, n: int = MAX_SUGGESTED) -> list[str]:
    """The names of ``available`` nearest ``name`` (:func:`distance`), nearest first: at most ``n``, all as
    near as the nearest (``gpt-2`` gives ``gpt2`` alone if it is there, else the few ``gpt2-...``), which must
    be near enough to be a slip (a third of the name's length, at least 1, or what difflib calls close)."""
    names = list(dict.fromkeys(available))
    if not names or not _normal(name):  # nothing typed is near everything
        return []
    ranked = sorted((distance(name, c), i, c) for i, c in enumerate(names))
    best, _, first = ranked[0]
    if best[0] > max(1, len(_normal(name)) // 3) and not difflib.get_close_matches(name, [first], cutoff=0.6):
        return []
    return [c for d, _, c in ranked if d[0] == best[0]][:n]


def suggest(name: str, available: Iterable[str]) -> str:
    """``; did you mean 'a'?`` or ``; did you mean 'a', 'b' or 'c'?`` (:func:`closest`), or nothing."""
    close = [repr(c) for c in closest(name, available)]
    if not close:
        return ""
    listed = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f"; did you mean {listed}?"


def did_you_mean(name: str, available: Sequence[str], *, more: str = "") -> str:
    """The tail of an 'unknown name' message: the closest names (:func:`suggest`), then what is available:
    the first MAX_LISTED names and how many others, followed by ``more`` (where to see them all)."""
    listing = ", ".join(available[:MAX_LISTED]) if available else "nothing"
    if len(available) > MAX_LISTED:
        listing += f", and {len(available) - MAX_LISTED} more" + (f": {more}" if more else "")
    return f"{suggest(name, available)} (available: {listing})"


class NonFiniteError(GptzooError):
    """Training met a non-finite loss, gradient norm or weight (and train.on_nonfinite is "stop")."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, re-raised by a command that can say what it kept (e.g. the last complete checkpoint).
    The CLI prints the message on one line and exits with status 130."""

"""The sampler chain: registered steps applied in order, then a choice of one token per row.

A chain ``[temperature(0.7), top_k(50), top_p(0.9)]`` transforms next-token logits step by step
(order matters: temperature before top_p changes which tokens top_p keeps) and samples from the
softmax of the result with a torch.Generator; a chain ending in ``greedy`` takes the argmax.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gptzoo import plugin_code
from gptzoo.compat import takes_no_arguments
from gptzoo.errors import GptzooError, PluginError, exception_text
from gptzoo.interfaces import Sampler, SamplerFlag
from gptzoo.recipe.validate import step_problems
from gptzoo.registry import Entry, Registry, show_plain

Spec = list[tuple[str, dict[str, Any]]]
"""A chain as (sampler name, parameters) pairs, in order."""

PASSED = ("real", "generator")
"""The keyword arguments the chain passes a step whose ``__call__`` names them (contract 4)."""


def keywords_of(step: Sampler) -> tuple[str, ...]:
    """Which of :data:`PASSED` a step's ``__call__`` takes by name (all of them with ``**kwargs``; none
    when its signature cannot be read): a step written before contract 4 gets none."""
    try:
        params = inspect.signature(step.__call__).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return PASSED
    named = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return tuple(name for name in PASSED if name in named)


@dataclass(frozen=True)
class Traits:
    """What a sampler's factory declares about its place in a chain (read before anything is built)."""

    flag: SamplerFlag | None
    sampling_only: bool
    picks: bool
    """The factory's ``picks`` (a Sampler class's): the step chooses the token, so it ends the chain."""
    greedy: bool
    """The factory's ``greedy``: the step a chain ends in when nothing samples."""


@functools.lru_cache(maxsize=256)
def traits(entry: Entry) -> Traits:
    """The factory's ``flag``, ``sampling_only``, ``picks`` and ``greedy``, read once per entry; a
    PluginError naming the sampler when one is not what gptzoo.interfaces.Sampler says (a SamplerFlag
    of an int or float parameter the factory takes, a bool)."""
    with plugin_code.running(entry, "has a broken flag"):
        flag = getattr(entry.factory, "flag", None)
        sampling_only = getattr(entry.factory, "sampling_only", False)
        picks = getattr(entry.factory, "picks", False) is True  # a factory that is no Sampler class: unknown
        greedy = getattr(entry.factory, "greedy", False)
    problem = None
    if flag is not None and type(flag) is not SamplerFlag:
        problem = f"its flag is {show_plain(flag)}, not a gptzoo.interfaces.SamplerFlag"
    elif flag is not None:
        problem = _flag_problem(entry, flag)
    if problem is None and type(sampling_only) is not bool:
        problem = f"its sampling_only is {show_plain(sampling_only)}, not True or False"
    if problem is None and type(greedy) is not bool:
        problem = f"its greedy is {show_plain(greedy)}, not True or False"
    if problem is None and greedy and not picks:
        problem = "it declares greedy = True but does not pick the token (picks = True and a pick method)"
    if problem:
        raise PluginError(f"{plugin_code.culprit(entry)} {problem}; {plugin_code.fix(entry)}")
    return Traits(flag, sampling_only, picks, greedy)


def _flag_problem(entry: Entry, flag: SamplerFlag) -> str | None:
    """Why a SamplerFlag cannot be a command-line flag of this sampler, or None."""
    if not (flag.type is int or flag.type is float):
        return f"its flag's type is {show_plain(flag.type)}, not int or float"
    if type(flag.order) is not int:
        return f"its flag's order is {show_plain(flag.order)}, not an int"
    if type(flag.help) is not str or "\n" in flag.help:
        return f"its flag's help is {show_plain(flag.help)}, not one line of text"
    if type(flag.zero_is_greedy) is not bool:
        return f"its flag's zero_is_greedy is {show_plain(flag.zero_is_greedy)}, not True or False"
    signature = plugin_code.signature(entry)
    params = signature.parameters.values() if signature is not None else ()
    takes = signature is None or any(p.name == flag.param or p.kind == p.VAR_KEYWORD for p in params)
    if type(flag.param) is not str or not takes:
        return f"its flag's param {show_plain(flag.param)} is not a parameter of its factory"
    return None


def option(name: str) -> str:
    """``--top-k``: the command-line flag of a sampler named ``top_k``."""
    return "--" + name.replace("_", "-")


@functools.lru_cache(maxsize=8)
def flagged(registry: Registry) -> tuple[tuple[Entry, SamplerFlag], ...]:
    """Every registered sampler with a flag, in the flags' order (then by name); found once per registry."""
    steps = [(entry, traits(entry).flag) for entry in registry.entries("sampler")]
    return tuple(sorted(((e, f) for e, f in steps if f is not None), key=lambda ef: (ef[1].order, ef[0].name)))


@functools.lru_cache(maxsize=8)
def greedy_step(registry: Registry) -> str:
    """The name of the registered sampler that declares ``greedy`` (the first, if several do).

    Raises:
        GptzooError: none does (a plugin replaced the built-in greedy step with one that does not say so).
    """
    for entry in registry.entries("sampler"):
        if traits(entry).greedy:
            return entry.name
    raise GptzooError(
        "no registered sampler declares greedy = True (the step a chain ends in when nothing samples); a plugin "
        "that replaces the greedy step must declare it, or name a picking step in the recipe's [generate] samplers"
    )


class SamplerChain:
    def __init__(self, steps: Sequence[Sampler], spec: Spec | None = None, entries: Sequence[Entry] = ()) -> None:
        for i, step in enumerate(steps[:-1]):
            if step.picks:
                raise GptzooError(
                    f"sampler step {i + 1} ({type(step).__name__}) chooses the token, so it must come last"
                )
        self.steps = list(steps)
        self.spec = spec or []
        self.entries = list(entries)
        """The registry entry of each step, when the chain came from a registry (messages name its plugin)."""
        self.keywords = [keywords_of(step) for step in self.steps]
        """Which of ``real`` and ``generator`` each step takes."""
        self.resets = [reset for step in self.steps if takes_no_arguments(reset := getattr(step, "reset", None))]
        """The steps' ``reset()`` methods, called before each generation."""

    @classmethod
    def from_registry(cls, registry: Registry, spec: Sequence[tuple[str, Mapping[str, Any]]]) -> SamplerChain:
        """A chain from (name, params) pairs: each step's check runs, then its factory; bad parameters
        become GptzooErrors naming the step, a broken sampler a PluginError naming its plugin."""
        steps, entries = [], []
        for name, params in spec:
            entry = registry.get("sampler", name)
            entries.append(entry)
            note = plugin_code.overridden(entry)
            problems = plugin_code.check(entry, params)
            if problems:
                raise GptzooError(f"sampler {name!r}: {'; '.join(problems)}{note}")
            try:
                step = plugin_code.build(entry, params, user_errors=(TypeError, ValueError))
            except (TypeError, ValueError) as exc:
                raise GptzooError(f"sampler {name!r}: {exception_text(exc)}{note}") from None
            plugin_code.check_contract(entry, step)
            steps.append(step)
        return cls(steps, [(name, dict(params)) for name, params in spec], entries)

    def describe(self) -> str:
        """e.g. ``temperature(temperature=0.8) -> top_k(k=50) -> sample``."""
        parts = [
            f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})" if params else name
            for name, params in self.spec
        ]
        if not (self.steps and self.steps[-1].picks):
            parts.append("sample")
        return " -> ".join(parts)

    def reset(self) -> None:
        """Call every step's ``reset()`` (the start of a generation: per-generation state is forgotten)."""
        for reset in self.resets:
            reset()

    def transform(
        self,
        logits: Tensor,
        input_ids: Tensor,
        *,
        real: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Apply every step: logits (B, V) and tokens so far (B, T) -> logits (B, V).

        real: (B, T) bool, False at left padding; None: every position is real. Passed, with
            ``generator``, to the steps that take them (:func:`keywords_of`).
        """
        passed: dict[str, Any] = {"generator": generator}
        for step, keywords in zip(self.steps, self.keywords, strict=True):
            if "real" in keywords and "real" not in passed:
                passed["real"] = real if real is not None else torch.ones_like(input_ids, dtype=torch.bool)
            logits = step(logits, input_ids, **{name: passed[name] for name in keywords})
        return logits

    def rehearse(self, vocab_size: int, prompt: Sequence[int]) -> None:
        """Run the chain once on two made-up rows of logits after ``prompt`` (spread evenly over [-20, 20],
        and the same reversed, so that every token has a positive logit in one and a negative one in the
        other), so that a parameter it cannot use (a penalty whose quotient overflows) is refused before
        anything is generated; its per-generation state is reset afterwards.

        Raises:
            GptzooError: what the chain raises on those rows.
        """
        spread = torch.linspace(-20.0, 20.0, vocab_size)
        logits = torch.stack([spread, spread.flip(0)])
        try:
            self(logits, torch.tensor([list(prompt)] * 2), torch.Generator().manual_seed(0))
        finally:
            self.reset()

    def __call__(
        self,
        logits: Tensor,
        input_ids: Tensor,
        generator: torch.Generator | None = None,
        *,
        real: Tensor | None = None,
    ) -> Tensor:
        """The next token of each row, (B,); ``real`` as :meth:`transform` takes it.

        Raises:
            GptzooError: the steps turned a row's logits into NaN or +inf, or masked all of them.
        """
        logits = self.transform(logits.float(), input_ids, real=real, generator=generator)
        broken = (logits.isnan() | logits.isposinf()).any(dim=-1) | logits.isneginf().all(dim=-1)
        if broken.any():
            raise GptzooError(
                f"the sampler chain {self.describe()} turned the logits of {prompts_of(broken)} into NaN or "
                "infinity (or masked every token): a parameter is too extreme for them (e.g. a penalty near 0)"
            )
        if self.steps and self.steps[-1].picks:
            picked = self.steps[-1].pick(logits, generator)
            problem = pick_problem(picked, logits)
            if problem is not None:
                who = (
                    plugin_code.culprit(self.entries[-1])
                    if self.entries
                    else f"sampler {type(self.steps[-1]).__name__}"
                )
                raise PluginError(f"{who}: {problem}; return one possible token id per row from pick")
            return picked
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def pick_problem(picked: object, logits: Tensor) -> str | None:
    """Why a picking step's ``pick`` of the logits (B, V) is not one possible token id per row: its
    type or shape, an id outside [0, V), or one at a masked (-inf) logit; None when it is."""
    rows, vocab = logits.shape
    if not isinstance(picked, Tensor) or tuple(picked.shape) != (rows,) or picked.dtype != torch.long:
        what = f"{tuple(picked.shape)} {picked.dtype}" if isinstance(picked, Tensor) else show_plain(picked)
        return f"pick gave {what}, not a (B,) = ({rows},) long tensor of token ids"
    outside = (picked < 0) | (picked >= vocab)
    if outside.any():
        row = int(outside.nonzero()[0])
        return f"pick gave token {int(picked[row])} for row {row + 1}, outside the vocabulary [0, {vocab})"
    masked = logits.gather(1, picked[:, None]).squeeze(1).isneginf()
    if masked.any():
        row = int(masked.nonzero()[0])
        return f"pick gave token {int(picked[row])} for row {row + 1}, whose logit the chain masked (-inf)"
    return None


def prompts_of(rows: Tensor) -> str:
    """``"prompt 2"`` or ``"prompts 1, 3"``: the rows set in a (B,) bool mask, counted from 1."""
    picked = [str(i + 1) for i in rows.nonzero().flatten().tolist()]
    return f"prompt{'s' if len(picked) > 1 else ''} {', '.join(picked)}"


def chain_spec(
    recipe_steps: Spec,
    flags: Mapping[str, float | int | None],
    *,
    registry: Registry,
    given: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> Spec:
    """The effective chain: the recipe's steps, changed by the command line.

    flags: sampler name -> the value of its flag (``--top-k 50``: ``{"top_k": 50}``; None: not given).
    given: steps of ``--sampler NAME:k=v``, in the order given.

    A step the command line names replaces the parameters of the chain's step of that sampler, or
    is inserted: a flagged sampler by its flag's order (before the first step that has no flag or a
    later order: Hugging Face's order for the built-ins), any other after the chain's steps and
    before a step that picks the token (a picking step replaces the chain's last one, if that picks).
    ``--temperature 0`` drops every ``sampling_only`` step and any picking step and ends in greedy,
    as Hugging Face does; a sampling_only step from the command line drops a final greedy of the
    recipe; a chain in which nothing samples (no sampling_only step, no picking step: only a
    repetition penalty, or nothing at all) ends in greedy, as Hugging Face's default does.

    Raises:
        GptzooError: a step given twice (by a flag and ``--sampler``, or twice by ``--sampler``), an
            unknown sampler.
        PluginError: a sampler whose flag, sampling_only or picks is malformed.
    """

    def resolve(name: str) -> tuple[Entry, Traits]:
        entry = registry.get("sampler", name)
        return entry, traits(entry)

    steps = [(name, dict(p)) for name, p in recipe_steps]
    options = {entry.name: flag for entry, flag in flagged(registry)}
    unknown = [name for name, value in flags.items() if value is not None and name not in options]
    if unknown:
        raise GptzooError(
            f"no registered sampler has the flag {option(unknown[0])}; flags: {', '.join(map(option, options))}"
        )
    asked: list[tuple[str, dict[str, Any], str]] = []  # (name, params, how it was asked for)
    for name, flag in options.items():
        value = flags.get(name)
        if value is not None:
            asked.append((name, {flag.param: value}, f"{option(name)} {value}"))
    asked += [(name, dict(params), f"--sampler {name}") for name, params in given]
    seen: dict[str, str] = {}
    sampling_asked = False
    for name, params, how in asked:
        entry, info = resolve(name)
        if how.startswith("--sampler") and (problems := step_problems(how, entry, params, registry)):
            raise GptzooError("; ".join(problems))
        if entry.name in seen:
            raise GptzooError(f"{seen[entry.name]} and {how} both set sampler {entry.name!r}; give it once")
        seen[entry.name] = how
        sampling_asked |= info.sampling_only
        found = [i for i, (step, _) in enumerate(steps) if resolve(step)[0] == entry]
        if found:
            steps[found[0]] = (name, params)
        elif info.flag is not None and not info.picks:
            at = next(
                (
                    i
                    for i, (step, _) in enumerate(steps)
                    if (other := resolve(step)[1].flag) is None or other.order > info.flag.order
                ),
                len(steps),
            )
            steps.insert(at, (name, params))
        elif info.picks and steps and resolve(steps[-1][0])[1].picks:
            steps[-1] = (name, params)
        else:
            steps.insert(len(steps) - 1 if steps and resolve(steps[-1][0])[1].picks else len(steps), (name, params))
    zeroed = [entry for entry, flag in flagged(registry) if flag.zero_is_greedy and flags.get(entry.name) == 0]
    if zeroed:
        kept = []
        for name, params in steps:
            entry, info = resolve(name)
            if not (info.sampling_only or info.picks or entry in zeroed):
                kept.append((name, params))
        return [*kept, (greedy_step(registry), {})]
    ends_greedy = bool(steps) and resolve(steps[-1][0])[1].greedy
    if sampling_asked and ends_greedy and not any(resolve(name)[1].greedy for name in seen):
        steps.pop()  # asking for sampling overrides a recipe that ends in greedy
    elif not any(info.sampling_only or info.picks for info in (resolve(name)[1] for name, _ in steps)):
        steps.append((greedy_step(registry), {}))
    return steps

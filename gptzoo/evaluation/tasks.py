"""lm-evaluation-harness tasks for ``gptzoo eval --tasks``, built and checked before any model loads.

A task is a user's YAML file (``--include-path``) or one of the harness's own, and each part of it can be
wrong: YAML that does not parse (the harness then skips the file and calls the task unknown), a data file
that is missing, a hub dataset out of reach offline, an ``output_type`` or a ``!function`` the harness
cannot resolve, a template naming a field the documents lack, no documents, or fewer documents than
``--num-fewshot`` examples. :func:`check_tasks` builds every task once, and the first request of each the
way the harness will build them all, so each of these is a message naming the task, its file and the fix
before the model's load, rather than a traceback after it; the built tasks are what the run evaluates.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gptzoo.errors import GptzooError, suggest


@dataclass(frozen=True)
class Tasks:
    """The tasks (and groups) asked for, built, and the harness's task manager."""

    names: list[str]
    built: list[Any]
    manager: Any


class _AnyTag(yaml.SafeLoader):
    """YAML with the harness's tags (``!function``) read as nothing: parsing only."""


_AnyTag.add_multi_constructor("!", lambda loader, suffix, node: None)


def _unreadable(include_path: str | None, name: str) -> str:
    """Why a task the harness does not know may be missing: a YAML file of the include path that names it
    and does not parse (the harness skips such files)."""
    if include_path is None:
        return ""
    for path in sorted(Path(include_path).rglob("*.y*ml")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if name not in text:
            continue
        try:
            yaml.load(text, Loader=_AnyTag)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            return f"; {path} names it but is not valid YAML ({problem}{at}): fix the file"
    return ""


def _source(manager: Any, name: str) -> str:
    entry = manager.task_index.get(name)
    path = getattr(entry, "yaml_path", None)
    return f"task {name!r} ({path})" if path else f"task {name!r}"


def _load(manager: Any, name: str) -> dict[str, Any]:
    """The harness's load of one task, group or tag; its failures as messages."""
    task = _source(manager, name)
    try:
        return manager.load(name)
    except StopIteration:  # the datasets json and csv builders on a file with no rows
        raise GptzooError(f"{task}: its data file has no documents; give it at least one") from None
    except FileNotFoundError as exc:
        raise GptzooError(
            f"{task}: a data file is missing ({exc}); data_files are read relative to the folder gptzoo runs "
            f"in ({os.getcwd()})"
        ) from None
    except ConnectionError as exc:
        raise GptzooError(
            f"{task}: cannot fetch its dataset ({exc}); run once with network access (HF_DATASETS_OFFLINE and "
            "HF_HUB_OFFLINE unset) to cache it, or point dataset_path at local files"
        ) from None
    except ImportError as exc:
        raise GptzooError(f"{task}: {exc}; a !function names module.function, the module beside the YAML") from None
    except Exception as exc:  # the harness's own checks of a config: output_type, metrics, filters
        if type(exc).__name__ == "UndefinedError":  # jinja2, rendering a template on a document
            raise GptzooError(f"{task}: a template names a field its documents do not have ({exc})") from None
        raise GptzooError(f"{task} cannot be loaded: {exc}") from None


def _fewshot(task: Any, num_fewshot: int | None) -> None:
    """``--num-fewshot`` on a task as the harness's simple_evaluate sets it (a task's own 0 stays)."""
    if num_fewshot is not None and task.get_config("num_fewshot") != 0:
        task.set_config(key="num_fewshot", value=num_fewshot)
    elif task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)


def _first_request(manager: Any, name: str, task: Any) -> None:
    """The task's first request, built as the harness builds them all: the templates, the functions and
    the few-shot examples each run once on a document."""
    source = _source(manager, name)
    docs = task.eval_docs
    if len(docs) == 0:
        raise GptzooError(f"{source} has no documents to evaluate; give its evaluation split at least one")
    shots = task.get_config("num_fewshot") or 0
    pool = task.fewshot_docs() if shots else None
    if pool is not None:
        # the harness leaves the question out of its own examples when they come from the evaluated split
        same = getattr(getattr(task, "fewshot_cfg", None), "split", None) == task.get_config("test_split")
        most = len(pool) - 1 if same else len(pool)
        if shots > most:
            raise GptzooError(
                f"--num-fewshot {shots}: {source} has {most} document(s) to draw examples from; give "
                f"--num-fewshot {max(most, 0)} or fewer"
            )
    try:
        task.build_all_requests(limit=1)
    except Exception as exc:
        fields = ", ".join(docs[0]) if hasattr(docs[0], "keys") else type(docs[0]).__name__
        kind = type(exc).__name__
        if kind == "UndefinedError":  # jinja2: a template names a field the documents do not have
            raise GptzooError(
                f"{source}: a template names a field its documents do not have ({exc}); they have: {fields}"
            ) from None
        raise GptzooError(f"{source} cannot build a request from its first document ({kind}: {exc})") from None


def check_tasks(names: Sequence[str], include_path: str | None = None, num_fewshot: int | None = None) -> Tasks:
    """The harness's tasks of these names, built, with ``num_fewshot`` set, each checked by building its
    first request.

    Raises:
        GptzooError: an include path that is not a folder, a task the harness does not know (with the
            names closest to it, or the YAML file that names it and does not parse), a task that cannot
            be loaded or cannot build a request (naming the task, its file and the fix).
    """
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise GptzooError(f"--include-path {include_path!r} is not a folder; give the folder of your task YAML files")
    manager = TaskManager(include_path=include_path)
    known = manager.all_tasks
    for name in names:
        if name not in known:
            why = _unreadable(include_path, name) or suggest(name, known)
            raise GptzooError(f"lm-evaluation-harness has no task {name!r}{why}")
    built: list[Any] = []
    for name in names:
        loaded = _load(manager, name)
        for leaf, task in loaded["tasks"].items():
            _fewshot(task, num_fewshot)
            _first_request(manager, leaf, task)
        if name in loaded["groups"]:
            built.append(loaded["groups"][name])
        else:  # a task, or a tag's tasks
            built.extend(loaded["tasks"].values())
    return Tasks(list(names), built, manager)

"""``gptzoo eval``: loss, perplexity and bits per byte on held-out text, at several lengths."""

from __future__ import annotations

import argparse
from contextlib import nullcontext

from gptzoo.cli.args import Parser, Subparsers, count_or_all, integer, lengths, positive_int
from gptzoo.cli.console import Console, print_json, status, warn
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.model import load_named, model_parser
from gptzoo.defaults import PRECISIONS
from gptzoo.errors import GptzooError

DATA_SAMPLE = 65_536
"""The val tokens of prepared data ``eval --data`` scores without --max-tokens: a sample whose loss is known
to about 1% (the val.bin of a corpus may hold millions: minutes of scoring at each length)."""
UNSET = -1
"""--max-tokens not given."""


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    overrides = "override a recipe key where the weights keep their meaning, e.g. model.attention=eager"
    p = sub.add_parser(
        "eval",
        parents=[common, model_parser(overrides)],
        help="loss, perplexity and bits per byte on held-out text, at several lengths; or benchmarks (--tasks)",
    )
    p.add_argument(
        "--text", action="append", default=[], metavar="FILE", help="a UTF-8 text file, one document (repeatable)"
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="DIR",
        help="prepared data (`gptzoo prepare`): its val.bin, in the model's tokenizer (repeatable)",
    )
    p.add_argument(
        "--lengths",
        type=lengths,
        metavar="L,L,...",
        help="context lengths in tokens, also beyond the training context where the positions allow "
        "(default: the context length, at most 1024)",
    )
    p.add_argument(
        "--stride", type=positive_int, metavar="S", help="tokens between sliding windows (default: half the length)"
    )
    p.add_argument("--batch", type=positive_int, metavar="B", help="windows per forward (default: by memory)")
    p.add_argument(
        "--max-tokens",
        type=count_or_all,
        default=UNSET,
        metavar="N|all",
        help=f"only the first N tokens of each text (default: all of a --text file, the first {DATA_SAMPLE:,} of a "
        "--data's val.bin)",
    )
    p.add_argument(
        "--dtype",
        choices=tuple(PRECISIONS),
        default="float32",
        help="int8: every Linear layer's weights in int8 (a float32 scale per row), int4: in llama.cpp's Q4_1 blocks "
        "(32 4-bit weights, a float16 scale and minimum) and the output head in int8; the rest in float32",
    )
    harness = p.add_argument_group("benchmarks through lm-evaluation-harness (pip install 'gptzoo[eval]')")
    harness.add_argument("--tasks", metavar="T1,T2", help="the harness's task names (hellaswag, arc_easy, ...)")
    harness.add_argument("--include-path", metavar="DIR", help="a folder of task YAML files of your own")
    harness.add_argument(
        "--num-fewshot", type=integer, metavar="K", help="examples in each prompt (default: the task's)"
    )
    harness.add_argument("--limit", type=positive_int, metavar="N", help="only the first N documents of each task")
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    if args.tasks is not None:
        run_tasks(args, out, err)
        return
    options = (("--include-path", args.include_path), ("--num-fewshot", args.num_fewshot), ("--limit", args.limit))
    harness_only = [flag for flag, value in options if value is not None]
    if harness_only:
        raise GptzooError(f"{harness_only[0]} is an option of --tasks (lm-evaluation-harness); give --tasks T1,T2")
    with importing():
        from gptzoo.evaluation import eval_model
        from gptzoo.evaluation.display import EvalProgress, render_eval
        from gptzoo.evaluation.perplexity import nothing_scored
        from gptzoo.evaluation.texts import check_inputs, val_tokens

    check_inputs(args.text, args.data)  # before the model loads, which may take minutes
    data_tokens = DATA_SAMPLE if args.max_tokens == UNSET else args.max_tokens
    max_tokens = None if args.max_tokens == UNSET else args.max_tokens
    if not args.json and data_tokens is not None:
        for directory in args.data:
            total = val_tokens(directory)
            if total > data_tokens:
                warn(
                    err,
                    f"--data {directory}: scoring the first {data_tokens:,} of its {total:,} val tokens; "
                    "--max-tokens all scores them all",
                )
    loaded = load_named(args, command_registry(err), dtype=args.dtype, err=err)
    for warning in loaded.warnings:
        warn(err, warning)
    scored = ", ".join([*(args.text or []), *(args.data or [])])
    with (
        status(err, f"scoring {scored}", quiet=args.json),
        nullcontext() if args.json else EvalProgress(err) as progress,
    ):
        report = eval_model(
            loaded,
            texts=args.text,
            data=args.data,
            lengths=args.lengths,
            stride=args.stride,
            batch_size=args.batch,
            max_tokens=max_tokens,
            data_tokens=data_tokens,
            progress=progress,
            name=args.model,
        )
    refusal = nothing_scored(loaded.model, report["scores"])
    if refusal is not None:
        raise GptzooError(refusal)
    if args.json:
        print_json(out, report)
        return
    render_eval(report, out)


HARNESS_EXTRA = "pip install 'gptzoo[eval]'"


def run_tasks(args: argparse.Namespace, out: Console, err: Console) -> None:
    """``--tasks``: the harness's tasks through gptzoo's model, its table (or its results as JSON)."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise GptzooError("--tasks names no task; give e.g. --tasks hellaswag,arc_easy")
    given = [f for f, v in (("--text", args.text), ("--data", args.data), ("--lengths", args.lengths)) if v]
    if given:
        raise GptzooError(f"{given[0]} scores held-out text, --tasks runs benchmarks: give one or the other")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise GptzooError(f"--num-fewshot {args.num_fewshot} is below 0; give 0 or more examples")
    try:
        with importing():
            from gptzoo.evaluation import harness
            from gptzoo.evaluation.tasks import check_tasks
    except ImportError as exc:
        missing = (exc.name or "lm_eval").split(".")[0]
        raise GptzooError(
            f"gptzoo eval --tasks needs lm-evaluation-harness ({missing} is missing): {HARNESS_EXTRA}"
        ) from None
    registry = command_registry(err)
    found = check_tasks(tasks, args.include_path, args.num_fewshot)
    loaded = load_named(args, registry, dtype=args.dtype, err=err)
    for warning in loaded.warnings:
        warn(err, warning)
    with status(err, f"running {', '.join(found.names)}", quiet=args.json):
        results = harness.run_tasks(loaded, found, limit=args.limit, batch_size=args.batch or 1, registry=registry)
    if args.json:
        print_json(out, harness.summary(results))
        return
    out.print(harness.table(results), markup=False, highlight=False)

"""Running a sweep: every (variant, seed) as an ordinary run directory, then its evaluation, then the report.

SWEEP/ holds ``sweep.json`` (the spec that decides the results), ``data/`` (when the spec prepares its
data), ``runs/VARIANT/seed-S/`` (run directories: resumable, locked while they train) and
``results/VARIANT/seed-S.json`` (written atomically once a run has trained and been evaluated, or has
diverged). A sweep interrupted at any point (Ctrl-C, SIGKILL) and run again with ``--resume`` skips the
runs that have results, resumes a run from its newest checkpoint (bit for bit, as `gptzoo train
--resume` does), and starts the rest; the results equal those of a sweep run straight through. The
sweep directory is locked, so two sweeps never share a run.

Each run trains for the budget (steps, tokens or training FLOPs; a FLOPs budget gives each variant the
steps its own FLOPs per token allow), logging every step, evaluating the validation loss about ten times
and checkpointing about four times (unless the spec sets train.eval_every / checkpoint_every / log_every).
A run whose loss or gradient becomes non-finite is recorded as diverged and the sweep goes on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from gptzoo.errors import GptzooError, Interrupted, NonFiniteError, RecipeError
from gptzoo.flops import train_flops_per_token
from gptzoo.hookspecs import STAT_MAX_MEAN
from gptzoo.recipe import Recipe, override_recipe
from gptzoo.registry import Registry, default_registry
from gptzoo.sweep.display import RunBar
from gptzoo.sweep.matching import active_parameters_of, parameters_of, train_flops
from gptzoo.sweep.names import DATA, RESULTS, RUNS, SPIKE
from gptzoo.sweep.names import SWEEP_RECORD as SPEC
from gptzoo.sweep.spec import SweepSpec, Variant
from gptzoo.training import distributed, run_dir
from gptzoo.training.trainer import seq_len_of

Say = Callable[[str], None]


@dataclass(frozen=True)
class Task:
    """One run: a variant at one seed, its recipe (budget applied) and where it goes."""

    variant: str
    seed: int
    recipe: Recipe
    run: Path
    result: Path
    data: Path
    eval_lengths: tuple[int, ...]
    eval_max_tokens: int | None
    eval_stride: int | None
    target_loss: float | None
    matched: dict[str, Any] | None


def tokens_per_step(recipe: Recipe) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return recipe.train.micro_batch_size * recipe.train.grad_accum * seq_len_of(recipe) * world


def budget_steps(spec: SweepSpec, recipe: Recipe, registry: Registry) -> int:
    kind, amount = spec.budget
    if kind == "steps":
        return int(amount)
    per_step = tokens_per_step(recipe)
    if kind == "tokens":
        return max(1, math.ceil(amount / per_step))
    return max(1, math.floor(amount / (train_flops(recipe, registry) * per_step)))


def _set(variant: Variant, key: str) -> bool:
    return any(o.partition("=")[0].strip() == key for o in variant.overrides)


def run_recipe(spec: SweepSpec, variant: Variant, seed: int, registry: Registry) -> Recipe:
    """The variant's recipe for one seed, with the budget's steps and the sweep's logging cadence."""
    recipe = spec.recipes[variant.name]
    recipe = replace(recipe, train=replace(recipe.train, seq_len=seq_len_of(recipe), seed=seed))
    steps = budget_steps(spec, recipe, registry)
    changes = [f"train.max_steps={steps}"]
    for key, value in (("eval_every", max(1, steps // 10)), ("checkpoint_every", max(1, steps // 4)), ("log_every", 1)):
        if not _set(variant, f"train.{key}"):
            changes.append(f"train.{key}={value}")
    return override_recipe(recipe, changes, registry=registry)


def tasks(spec: SweepSpec, out: Path, data: Path, registry: Registry) -> list[Task]:
    found = []
    for variant in spec.variants:
        matched = None
        if variant.match is not None:
            key = spec.match_key.removeprefix("model.")
            matched = {
                "by": variant.match,
                "key": spec.match_key,
                "value": getattr(spec.recipes[variant.name].model, key),
            }
        for seed in spec.seeds:
            found.append(
                Task(
                    variant.name,
                    seed,
                    run_recipe(spec, variant, seed, registry),
                    out / RUNS / variant.name / f"seed-{seed}",
                    out / RESULTS / variant.name / f"seed-{seed}.json",
                    data,
                    spec.eval_lengths,
                    spec.eval_max_tokens,
                    spec.eval_stride,
                    spec.target_loss,
                    matched,
                )
            )
    return found


# --- one run -------------------------------------------------------------------------------------


def _curve_stats(records: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    norms = [r["grad_norm"] for r in records if r.get("grad_norm") is not None]
    speeds = [r["tokens_per_s"] for r in records if r.get("tokens_per_s") is not None]
    spike, low = 0.0, math.inf
    for _, loss in train:
        spike, low = max(spike, loss - low), min(low, loss)
    reached = next((step for step, loss in val if target is not None and loss <= target), None)
    return {
        "train_curve": train,
        "val_curve": val,
        "final_val_loss": val[-1][1] if val else None,
        "best_val_loss": min(v for _, v in val) if val else None,
        "max_grad_norm": max(norms) if norms else None,
        "max_spike": spike,
        "tokens_per_s": sorted(speeds)[len(speeds) // 2] if speeds else None,
        "steps_to_target": reached,
        "skipped_steps": sum(1 for r in records if r.get("skipped")),
        **_balance(records),
    }


def _balance(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The components' balance (the records' ``NAME_max_mean`` tables, gptzoo.training.stats): ``balance``, per
    statistic and component, its mean over the last tenth of the logged records (at least one), the run's
    final balance; ``balance_curve``, per statistic, the worst component's by step."""
    tables = [r for r in records if any(k.endswith(STAT_MAX_MEAN) for k in r)]
    names = sorted({k for r in tables for k in r if k.endswith(STAT_MAX_MEAN)})
    final, curves = {}, {}
    for name in names:
        logged = [(r["step"], r[name]) for r in tables if isinstance(r.get(name), dict)]
        last: dict[str, list[float]] = {}
        for _, table in logged[-max(1, len(logged) // 10) :]:
            for path, value in table.items():
                if isinstance(value, int | float):
                    last.setdefault(path, []).append(value)
        final[name] = {path: statistics.fmean(values) for path, values in last.items()}
        curves[name] = [
            [step, max(v for v in table.values() if isinstance(v, int | float))]
            for step, table in logged
            if any(isinstance(v, int | float) for v in table.values())
        ]
    return {"balance": final, "balance_curve": curves}


def run_task(
    task: Task,
    *,
    log: Callable[[dict[str, Any]], None] | None = None,
    started: Callable[[int], None] | None = None,
    threads: int = 0,
    procs: distributed.Processes | None = None,
    registry: Registry | None = None,
    evaluating: Callable[[int, int], None] | None = None,
) -> dict[str, Any] | None:
    """Train (or resume) one run, evaluate its final checkpoint, and write its result; the result.
    ``log`` gets every metrics record, ``started`` the step the run starts from (gptzoo.training.trainer.train),
    ``evaluating`` the windows scored and their number as the evaluation goes.
    Under torchrun (``procs``) every process trains; only the first evaluates and writes (the others get None).
    A run killed after its last checkpoint is not trained again: its final validation loss is computed from
    that checkpoint if the kill came before it was logged."""
    from gptzoo.evaluation import eval_model
    from gptzoo.model.build import build_model
    from gptzoo.model.summary import kv_bytes_per_token, state_bytes
    from gptzoo.training.trainer import train

    if threads:
        torch.set_num_threads(threads)
    registry = registry if registry is not None else default_registry()
    main = procs is None or procs.is_main
    saved = run_dir.checkpoint_dirs(task.run)
    if main and not saved and task.run.exists():  # killed before its first checkpoint: nothing to keep
        shutil.rmtree(task.run)
    if procs is not None:
        distributed.barrier(procs)  # the others wait for that
    captured: list[dict[str, Any]] = []

    def record(entry: dict[str, Any]) -> None:
        captured.append(entry)
        if log is not None:
            log(entry)

    status, reason = "done", None
    trained = bool(saved) and saved[-1][0] >= task.recipe.train.max_steps  # killed after its last save
    if not trained:
        try:
            train(
                task.recipe,
                out=task.run,
                data=task.data,
                resume=bool(saved),
                log=record,
                started=started,
                registry=registry,
            )
        except NonFiniteError as exc:
            status, reason = "diverged", str(exc).split(";")[0]
    if not main:
        return None
    if trained:
        _final_validation(task, registry)
    records = run_dir.read_metrics(task.run) if (task.run / run_dir.METRICS).is_file() else captured
    stats = _curve_stats(records, task.target_loss)
    if (
        status == "done"
        and stats["final_val_loss"] is not None
        and stats["final_val_loss"] > stats["best_val_loss"] + SPIKE
    ):
        status = "diverged"
        reason = f"the final validation loss {stats['final_val_loss']:.4f} is {SPIKE:g} nat or more above the best"
    seq_len = task.recipe.train.seq_len  # set by run_recipe
    meta = build_model(task.recipe, device="meta", registry=registry)
    evaluation = None
    if status == "done":
        checkpoint = run_dir.latest(task.run)
        evaluation = eval_model(
            str(checkpoint),
            data=[task.data],
            lengths=list(task.eval_lengths) or [seq_len],
            max_tokens=task.eval_max_tokens,
            stride=task.eval_stride,
            registry=registry,
            progress=evaluating,
        )
    result = {
        "variant": task.variant,
        "seed": task.seed,
        "status": status,
        "reason": reason,
        "steps": task.recipe.train.max_steps,
        "params": parameters_of(meta),
        "active_params": active_parameters_of(meta),
        "train_flops_per_token": train_flops_per_token(meta, seq_len),
        "tokens_per_step": tokens_per_step(task.recipe),
        "kv_bytes_per_token": kv_bytes_per_token(meta, seq_len, torch.float32),
        "state_bytes_per_sequence": state_bytes(meta, seq_len, torch.float32),
        "matched": task.matched,
        **stats,
        "eval": evaluation["scores"] if evaluation is not None else None,
    }
    task.result.parent.mkdir(parents=True, exist_ok=True)
    run_dir.write_text_atomically(task.result, json.dumps(result, indent=1) + "\n")
    return result


def _final_validation(task: Task, registry: Registry) -> None:
    """Log the final validation loss of a run whose last checkpoint was saved but not evaluated: a run
    directory written before a step's metrics came ahead of its checkpoint (gptzoo before issue 26 saved
    first, so a kill between the save and the eval line left the last step without one). Today's trainer
    logs a step's eval before it saves, so only such a directory, resumed, comes here with its line missing."""
    from gptzoo.model.checkpoint import load_checkpoint
    from gptzoo.training.data import TokenData
    from gptzoo.training.trainer import validation_loss

    steps = task.recipe.train.max_steps
    if any(r["step"] == steps and r.get("val_loss") is not None for r in run_dir.read_metrics(task.run)):
        return
    newest = run_dir.latest(task.run)
    assert newest is not None
    loss = validation_loss(load_checkpoint(newest, registry=registry), task.recipe, TokenData.open(task.data))
    run_dir.append_metrics(
        task.run, {"step": steps, "val_loss": loss, "val_ppl": math.exp(min(loss, 700)), "time": time.time()}
    )


# --- the sweep -----------------------------------------------------------------------------------


def _check_out(out: Path, spec: SweepSpec, identity: dict[str, Any], resume: bool) -> None:
    stored = out / SPEC
    if out.exists() and not out.is_dir():
        raise GptzooError(f"--out {out} is a file; give a directory for the sweep")
    if stored.is_file():
        try:
            before = json.loads(stored.read_text(encoding="utf-8"))["identity"]
        except (OSError, ValueError, KeyError, TypeError):
            raise GptzooError(f"{stored} is not a sweep's record; give another --out") from None
        if not resume:
            raise GptzooError(f"{out} holds a sweep already; pass --resume to finish it, or give another --out")
        if before != identity:
            changed = ", ".join(k for k in identity if before.get(k) != identity[k])
            raise GptzooError(
                f"{out} holds another sweep (its {changed} differ from {spec.source}'s); give another --out, "
                "or the spec it ran"
            )
        return
    if resume:
        raise GptzooError(f"{out} holds no sweep to resume ({SPEC} is missing); run without --resume")
    if out.is_dir() and [p for p in out.iterdir() if p.name != run_dir.LOCK]:
        raise GptzooError(f"--out {out} already holds files and no sweep; give a new or empty directory")


def _check_runs(spec: SweepSpec, registry: Registry) -> None:
    """Every run's recipe (a seed, the budget's steps) is valid: all problems at once."""
    problems = []
    for variant in spec.variants:
        for seed in spec.seeds:
            try:
                run_recipe(spec, variant, seed, registry)
            except RecipeError as exc:
                problems += [f"variant {variant.name!r} seed {seed}: {p}" for p in exc.problems]
    if problems:
        raise RecipeError(spec.source, list(dict.fromkeys(problems)))


def _check_lengths(spec: SweepSpec, registry: Registry) -> None:
    """Some variant can be scored at some [eval] length: a sweep whose whole evaluation would be
    refused (every length past every variant's positions) is refused before it trains. A variant
    that refuses only some lengths, or only some variants refusing, is a result: the report says
    which length each refused and why."""
    from gptzoo.model.build import build_model

    if not spec.eval_lengths:
        return
    shortest = min(spec.eval_lengths)
    named = f"{shortest}, the shortest," if len(spec.eval_lengths) > 1 else str(shortest)
    problems = []
    for variant in spec.variants:
        model = build_model(run_recipe(spec, variant, spec.seeds[0], registry), device="meta", registry=registry)
        if model.too_long(shortest, "", "") is None:
            return
        problems.append(
            f"variant {variant.name!r} can score none of the [eval] lengths: {named} is longer than "
            f"{model.position_limit}; give [eval] lengths of {model.max_positions} or fewer"
        )
    raise RecipeError(spec.source, problems)


def _check_data(spec: SweepSpec, data: Path) -> None:
    """Prepared data fits every variant (tokenizer, vocabulary)."""
    from gptzoo.training.data import TokenData
    from gptzoo.training.trainer import check_data

    tokens = TokenData.open(data)
    problems = []
    for name, recipe in spec.recipes.items():
        try:
            check_data(recipe, tokens)
        except GptzooError as exc:
            problems.append(f"variant {name!r}: {exc}")
    if problems:
        raise RecipeError(spec.source, problems)


def prepared_data(spec: SweepSpec, out: Path, say: Say) -> Path:
    if spec.data_path is not None:
        return Path(spec.data_path)
    path = out / DATA
    if not path.is_dir():
        from gptzoo.training.data import DEFAULT_VAL_FRACTION, prepare

        assert spec.prepare is not None and spec.tokenizer is not None
        say(f"preparing {spec.prepare} with the {spec.tokenizer} tokenizer into {path}")
        prepare(spec.prepare, path, tokenizer=spec.tokenizer, val_fraction=spec.val_fraction or DEFAULT_VAL_FRACTION)
    return path


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    resume: bool = False,
    jobs: int = 1,
    registry: Registry | None = None,
    say: Say | None = None,
    display: Callable[[Task, int, int], RunBar] | None = None,
) -> dict[str, Any] | None:
    """Run every missing (variant, seed) of ``spec`` into ``out``, then write the report; the report.

    Args:
        jobs: runs at once, each in its own process (torch threads split between them).
        say: called with one line per event (a run finished, data prepared).
        display: for one run at a time, called with (task, its number, how many) to give its progress bar.

    Under torchrun every process takes part in every run (each run is distributed as `gptzoo train`
    distributes it); the first process checks, writes the results and the report, and returns it (the
    others return None).

    Raises:
        GptzooError: ``out`` holds files of something else, another sweep, or nothing to resume; data that
            does not fit. All of it is checked before anything is written.
        Interrupted: Ctrl-C; the message says how to resume.
    """

    registry = registry if registry is not None else default_registry()
    say = say or (lambda _line: None)
    out = Path(out)
    identity = spec.identity()
    procs = distributed.start()  # under torchrun: every run of the sweep trains in these processes
    if procs.distributed and jobs > 1:
        distributed.stop(procs, wait=False)
        raise GptzooError("under torchrun each run already uses every process; leave out --jobs")
    started = time.time()
    try:
        distributed.agree(
            procs,
            lambda: _check_runs(spec, registry),
            lambda: _check_lengths(spec, registry),
            lambda: None if spec.data_path is None else _check_data(spec, Path(spec.data_path)),
        )
        with run_dir.locked(out) if procs.is_main else nullcontext():
            distributed.agree(
                procs, lambda: _check_out(out, spec, identity, resume)
            )  # under the lock: no sweep races it
            report = _run(spec, out, identity, jobs, registry, say, display, procs, started)
        distributed.stop(procs)
        return report
    except KeyboardInterrupt:
        distributed.stop(procs, wait=False)
        raise Interrupted(f"the runs with results in {out} are kept: run the same command with --resume") from None
    except BaseException:
        distributed.stop(procs, wait=False)
        raise


def _run(
    spec: SweepSpec,
    out: Path,
    identity: dict[str, Any],
    jobs: int,
    registry: Registry,
    say: Say,
    display: Callable[[Task, int, int], RunBar] | None,
    procs: distributed.Processes,
    started: float,
) -> dict[str, Any] | None:
    from gptzoo.sweep.report import write_report

    prepared: list[Path] = []

    def setup() -> None:
        if not (out / SPEC).is_file():
            run_dir.write_text_atomically(
                out / SPEC, json.dumps({"spec": spec.source, "identity": identity}, indent=1) + "\n"
            )
        prepared.append(prepared_data(spec, out, say))
        if spec.data_path is None:
            _check_data(spec, prepared[0])

    distributed.agree(procs, setup)
    data = Path(str(distributed.share(str(prepared[0]) if prepared else None, procs)))
    every = tasks(spec, out, data, registry)
    missing = distributed.share([i for i, t in enumerate(every) if not t.result.is_file()], procs)
    todo = [every[i] for i in missing]  # type: ignore[union-attr]
    total = len(every)
    done = total - len(todo)
    if done and procs.is_main:
        say(f"{done} of {total} runs already have results; {len(todo)} to go")
    if jobs > 1 and len(todo) > 1:
        _parallel(todo, jobs, say, done, total)
    else:
        for k, task in enumerate(todo, start=done + 1):
            if display is not None and procs.is_main:
                with display(task, k, total) as bar:
                    result = run_task(
                        task, log=bar, started=bar.start, procs=procs, registry=registry, evaluating=bar.evaluating
                    )
            else:
                result = run_task(task, procs=procs, registry=registry)
            if result is not None:
                say(_finished(result, k, total))
    return write_report(spec, out, seconds=time.time() - started) if procs.is_main else None


def _parallel(todo: list[Task], jobs: int, say: Say, done: int, total: int) -> None:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_worker_task, task, threads) for task in todo]
        try:
            for k, future in enumerate(as_completed(futures), start=done + 1):
                say(_finished(future.result(), k, total))
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _worker_task(task: Task, threads: int) -> dict[str, Any] | None:
    """run_task in a worker process, a plugin's failure as its PluginError: its traceback stays behind."""
    from gptzoo.plugin_code import plugin_failures

    registry = default_registry()
    with plugin_failures(registry):
        return run_task(task, threads=threads, registry=registry)


def _finished(result: dict[str, Any], k: int, total: int) -> str:
    head = f"[{k}/{total}] {result['variant']} seed {result['seed']}:"
    if result["status"] == "diverged":
        return f"{head} diverged ({result['reason']})"
    score = (result["eval"] or [{}])[0]
    bpb = f", {score['bits_per_byte']:.4f} bits/byte" if score.get("bits_per_byte") is not None else ""
    return f"{head} val loss {result['final_val_loss']:.4f}{bpb}"

"""Training: a recipe's model on prepared token data, resumable, in one process or under torchrun.

One optimizer step takes micro_batch_size x grad_accum sequences in each of the world_size
processes: global window w of the data stream (gptzoo.training.data.Windows, a pure function of the seed)
goes to step w // G, where G is that global batch, and each process takes its contiguous slice of
the step's windows. The data position is therefore the step itself, and 1 process with
grad_accum 2 sees exactly the sequences that 2 processes with grad_accum 1 see.

Resuming continues bit for bit (on CPU in float32): weights, AdamW state, RNG states and the step
come back from the checkpoint, and the data and the learning rate are functions of the step.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gptzoo.atomic import holds_files
from gptzoo.errors import CheckpointError, GptzooError, NonFiniteError
from gptzoo.flops import TRAIN_FORWARD_RATIO, forward_flops
from gptzoo.model.build import build_model
from gptzoo.model.checkpoint import RECIPE, read_recipe
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe, TrainSpec
from gptzoo.training import distributed, run_dir
from gptzoo.training.data import TokenData, Windows, eval_batches, n_windows, rank_slice
from gptzoo.training.optim import lr_at, make_optimizer

RESUMABLE_CHANGES = (
    "max_steps",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "peak_tflops",
    "data",
    "compile",
    "on_nonfinite",
)
"""[train] keys a resumed run may change; any other difference from the checkpoint's recipe is refused."""


assert set(RESUMABLE_CHANGES) <= {f.name for f in fields(TrainSpec)}


@dataclass
class TrainResult:
    steps: int
    """Optimizer steps done in total (including those before a resume)."""
    loss: float
    """The last step's training loss."""
    val_loss: float | None
    tokens_per_s: float
    mfu: float | None
    skipped: int
    checkpoint: Path | None


Log = Callable[[dict[str, Any]], None]


def seq_len_of(recipe: Recipe) -> int:
    return recipe.train.seq_len or recipe.model.context_length


def check_data(recipe: Recipe, data: TokenData) -> None:
    """The data's tokenizer is the recipe's, and its ids fit the model's vocabulary."""
    meta_tok = data.meta.get("tokenizer", {})
    name = meta_tok.get("name") if isinstance(meta_tok, dict) else meta_tok
    if recipe.tokenizer is not None and name != recipe.tokenizer.name:
        raise GptzooError(
            f"{data.path} was prepared with the {name!r} tokenizer, but recipe {recipe.name!r} uses "
            f"{recipe.tokenizer.name!r}; run `gptzoo prepare ... --tokenizer {recipe.tokenizer.name}` for it"
        )
    vocab = int(data.meta.get("vocab_size", 0))
    if vocab > recipe.model.vocab_size:
        raise GptzooError(
            f"{data.path} holds token ids up to {vocab - 1}, but the model's vocab_size is {recipe.model.vocab_size}; "
            f"use a recipe with vocab_size >= {vocab} or prepare the data with the recipe's tokenizer"
        )


def check_resumable(recipe: Recipe, saved: Recipe, where: Path) -> None:
    """The checkpoint trained this recipe: same model, same math (lr, batch, schedule, seed...)."""
    problems = []
    if saved.model != recipe.model:
        problems.append("[model] differs")
    if (saved.tokenizer and saved.tokenizer.name) != (recipe.tokenizer and recipe.tokenizer.name):
        problems.append("[tokenizer] differs")
    for f in fields(TrainSpec):
        ours, theirs = getattr(recipe.train, f.name), getattr(saved.train, f.name)
        if f.name == "seq_len":
            ours, theirs = seq_len_of(recipe), seq_len_of(saved)
        if f.name not in RESUMABLE_CHANGES and ours != theirs:
            problems.append(f"[train] {f.name} is {theirs!r} there, {ours!r} here")
    if problems:
        raise CheckpointError(
            f"{where} is a checkpoint of a different recipe: {'; '.join(problems)}; resume with the run's own recipe ({where.parent.parent / RECIPE}) or start a new --out"
        )


PRECISION_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""train.precision -> the dtype its matmuls run in."""


@contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """The forward pass's context: nothing for float32, torch.autocast to the precision otherwise."""
    if precision == "float32":
        yield
        return
    with torch.autocast(device.type, dtype=PRECISION_DTYPES[precision]):
        yield


def measure_peak_flops(device: torch.device, precision: str) -> float:
    """FLOP/s of a large matmul in the training precision: the peak MFU is measured against."""
    dtype = PRECISION_DTYPES[precision]
    n = 8192 if device.type == "cuda" else 2048
    generator = torch.Generator(device=device).manual_seed(0)  # the global RNG is the run's, not this probe's
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    a @ b  # warm-up
    best = math.inf
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in float32."""
    logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


class Trainer:
    """The state of one run in this process; :meth:`run` trains to max_steps."""

    def __init__(
        self,
        recipe: Recipe,
        data: TokenData,
        out: Path,
        procs: distributed.Processes,
        *,
        resume: bool,
        init: GPT | None,
        log: Log,
    ) -> None:
        self.recipe, self.spec, self.out, self.procs, self.log = recipe, recipe.train, out, procs, log
        self.seq_len = seq_len_of(recipe)
        spec = self.spec
        self.global_batch = spec.micro_batch_size * spec.grad_accum * procs.world_size
        self.windows = Windows(data.train, self.seq_len, spec.seed)
        self.val = data.val
        n_windows(self.val, self.seq_len)  # val.bin must hold a window: say so now, not at the first evaluation
        self.peak = spec.peak_tflops * 1e12 or measure_peak_flops(procs.device, spec.precision)
        torch.manual_seed(spec.seed)
        model = init if init is not None else build_model(recipe)
        self.model = model.to(procs.device)
        self.step = 0
        self.skipped = 0
        state: dict[str, Any] | None = None
        if resume:
            state = self._load_latest()
        self.shared = distributed.replicate(self.model, procs, spec.parallel)
        self.optimizer = make_optimizer(self.shared, spec)
        if state is not None:
            self._set_optimizer_state(state["optimizer"])
            torch.set_rng_state(state["rng"]["cpu"])
            if procs.device.type == "cuda" and "cuda" in state["rng"]:
                torch.cuda.set_rng_state(state["rng"]["cuda"], procs.device)
        self.scaler = torch.amp.GradScaler("cuda") if spec.precision == "float16" else None
        if self.scaler is not None and state is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.forward = torch.compile(self.shared) if spec.compile else self.shared
        self.flops_per_token = (
            TRAIN_FORWARD_RATIO * sum(forward_flops(self.model, 1, self.seq_len).values()) / self.seq_len
        )

    # --- checkpoints -------------------------------------------------------------------------

    def _load_latest(self) -> dict[str, Any]:
        found = run_dir.checkpoint_dirs(self.out)
        if not found:
            raise CheckpointError(f"{self.out} has no checkpoint to resume from; train without --resume to start it")
        step, path = found[-1]
        saved = read_recipe(path)
        check_resumable(self.recipe, saved, path)
        tensors, state = run_dir.load(path)
        if state["world_size"] != self.procs.world_size:
            raise CheckpointError(
                f"{path} was trained by {state['world_size']} process(es), this run has {self.procs.world_size}: the global batch "
                f"(micro_batch_size x grad_accum x processes) would change; resume with {state['world_size']}, or adjust train.grad_accum in a new run"
            )
        if state["step"] >= self.spec.max_steps:
            raise CheckpointError(
                f"{path} has already trained {state['step']} of max_steps={self.spec.max_steps}; raise train.max_steps (--set train.max_steps=N) to train further"
            )
        if self.model.tied:
            tensors.pop("lm_head.weight", None)
        self.model.load_weights({k: v.to(self.procs.device) for k, v in tensors.items()}, source=str(path))
        self.step, self.skipped = int(state["step"]), int(state.get("skipped", 0))
        if self.procs.is_main:
            run_dir.truncate_metrics(self.out, self.step)
            run_dir.remove_partial(self.out)
        return state

    def _full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Model and optimizer state as one process would hold them (gathered under FSDP)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(self.shared, options=options)
        optim_state = get_optimizer_state_dict(self.shared, self.optimizer, options=options)
        model_state = {k.removeprefix("module."): v for k, v in model_state.items()}
        if self.model.tied:
            model_state.pop("lm_head.weight", None)
        return model_state, optim_state

    def _set_optimizer_state(self, optim_state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            self.shared, self.optimizer, optim_state, options=StateDictOptions(full_state_dict=True)
        )

    def save(self) -> Path | None:
        model_state, optim_state = self._full_state()  # a collective under FSDP: every process takes part
        if not self.procs.is_main:
            return None
        broken = [k for k, v in model_state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if broken:
            raise NonFiniteError(
                f"after step {self.step} the weights {broken[:3]} hold non-finite values; nothing was saved. Lower train.lr, or use float32"
            )
        rng: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if self.procs.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.procs.device)
        state = {
            "step": self.step,
            "skipped": self.skipped,
            "windows_seen": self.step * self.global_batch,
            "world_size": self.procs.world_size,
            "optimizer": optim_state,
            "rng": rng,
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
        }
        return run_dir.save(self.out, self.step, self.recipe, model_state, state, keep=self.spec.keep_checkpoints)

    # --- steps -------------------------------------------------------------------------------

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step: (loss, gradient norm, whether the update was applied)."""
        spec, mb = self.spec, self.spec.micro_batch_size
        lr = lr_at(self.step, spec)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        first, _ = rank_slice(self.step * self.global_batch, self.global_batch, self.procs.rank, self.procs.world_size)
        total = torch.zeros((), device=self.procs.device)
        ddp = isinstance(self.shared, nn.parallel.DistributedDataParallel)
        for micro in range(spec.grad_accum):
            x, y = self.windows.batch(first + micro * mb, mb)
            x, y = x.to(self.procs.device, non_blocking=True), y.to(self.procs.device, non_blocking=True)
            last = micro == spec.grad_accum - 1
            with (
                self.shared.no_sync() if ddp and not last else nullcontext(),
                autocast(spec.precision, self.procs.device),
            ):
                loss = loss_of(self.forward, x, y) / spec.grad_accum
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.detach()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = nn.utils.clip_grad_norm_(self.shared.parameters(), spec.grad_clip if spec.grad_clip > 0 else math.inf)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        loss_value = float(distributed.mean(total, self.procs))
        norm_value = float(norm)
        # float16: inf/nan gradients are the GradScaler's business (it skips the step and lowers the scale)
        finite = math.isfinite(loss_value) and (self.scaler is not None or math.isfinite(norm_value))
        if finite and self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        elif spec.on_nonfinite == "stop":
            raise NonFiniteError(
                f"step {self.step + 1}: the {'loss' if not math.isfinite(loss_value) else 'gradient norm'} is "
                f"{loss_value if not math.isfinite(loss_value) else norm_value}; nothing was saved for this step. "
                "Resume with --set train.on_nonfinite=skip to skip such steps, or start a new run with a lower train.lr or in float32"
            )
        elif self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if not finite:
            self.skipped += 1
        return loss_value, norm_value, finite

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over the first eval_batches batches (each process takes its share)."""
        self.shared.eval()
        batches = list(eval_batches(self.val, self.seq_len, self.spec.micro_batch_size, self.spec.eval_batches))
        per_process = max(1, len(batches) // self.procs.world_size)
        mine = (
            batches[self.procs.rank * per_process : (self.procs.rank + 1) * per_process]
            if len(batches) >= self.procs.world_size
            else batches
        )
        total = torch.zeros((), device=self.procs.device)
        for x, y in mine:
            with autocast(self.spec.precision, self.procs.device):
                total += loss_of(self.forward, x.to(self.procs.device), y.to(self.procs.device))
        self.shared.train()
        return float(distributed.mean(total / len(mine), self.procs))

    def run(self) -> TrainResult:
        spec = self.spec
        self.shared.train()
        loss, val_loss, checkpoint = math.nan, None, None
        tokens_per_step = self.global_batch * self.seq_len
        window_steps, window_time = 0, 0.0
        tokens_per_s, mfu = 0.0, None
        while self.step < spec.max_steps:
            start = time.perf_counter()
            loss, norm, applied = self.train_step()
            window_time += time.perf_counter() - start
            window_steps += 1
            step, last = self.step, self.step == spec.max_steps
            if step % spec.log_every == 0 or last or not applied:
                tokens_per_s = window_steps * tokens_per_step / window_time
                mfu = tokens_per_s * self.flops_per_token / self.procs.world_size / self.peak
                self.log(
                    {
                        "step": step,
                        "loss": loss,
                        "lr": lr_at(step - 1, spec),
                        "grad_norm": norm,
                        "tokens_per_s": tokens_per_s,
                        "mfu": mfu,
                        "skipped": not applied,
                        "time": time.time(),
                    }
                )
                window_steps, window_time = 0, 0.0
            if (spec.checkpoint_every and step % spec.checkpoint_every == 0) or last:
                checkpoint = self.save() or checkpoint
            if (spec.eval_every and step % spec.eval_every == 0) or last:
                val_loss = self.evaluate()
                self.log(
                    {"step": step, "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700)), "time": time.time()}
                )
        return TrainResult(self.step, loss, val_loss, tokens_per_s, mfu, self.skipped, checkpoint)


def check_out(out: Path, *, resume: bool) -> None:
    """--out is a run with checkpoints to resume, or (without --resume) new or empty."""
    if resume:
        if not run_dir.checkpoint_dirs(out):
            raise GptzooError(
                f"{out} has no checkpoints to resume; check --out, or remove {out} and train without --resume"
            )
    elif holds_files(out):
        raise GptzooError(f"{out} already holds files; pass --resume to continue that run, or choose another --out")


def data_dir_of(recipe: Recipe, data: str | Path | None) -> Path:
    if data is not None:
        return Path(data)
    if recipe.train.data:
        return (Path(recipe.source).parent / recipe.train.data).resolve()
    raise GptzooError(
        f"no training data: pass --data DIR (made by `gptzoo prepare`), or set train.data in {recipe.source}"
    )


def train(
    recipe: Recipe,
    *,
    out: str | Path,
    data: str | Path | None = None,
    resume: bool = False,
    init: GPT | None = None,
    log: Log | None = None,
) -> TrainResult:
    """Train ``recipe`` (from ``init``'s weights when given) into the run directory ``out``; every
    record also goes to ``log``. Under torchrun, call it in every process."""
    out = Path(out)
    procs = distributed.start()
    try:
        if recipe.train.precision == "float16" and procs.device.type != "cuda":
            raise GptzooError(
                "train.precision = 'float16' needs a CUDA GPU (its loss scaling is for GPUs); use 'bfloat16' or 'float32'"
            )
        data_dir = data_dir_of(recipe, data).resolve()
        tokens = TokenData.open(data_dir)
        check_data(recipe, tokens)
        check_out(out, resume=resume)
        recipe = replace(recipe, train=replace(recipe.train, data=str(data_dir)))  # RUN/recipe.toml works from anywhere

        def record(entry: dict[str, Any]) -> None:
            if procs.is_main:
                entry = {
                    k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in entry.items()
                }  # JSON has no NaN
                with (out / run_dir.METRICS).open("a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")
                if log is not None:
                    log(entry)

        trainer = Trainer(recipe, tokens, out, procs, resume=resume, init=init, log=record)
        if procs.is_main:  # the run directory appears once everything has been checked
            out.mkdir(parents=True, exist_ok=True)
            run_dir.write_text_atomically(out / RECIPE, recipe.to_toml())
        result = trainer.run()
    except BaseException:
        distributed.stop(procs, wait=False)
        raise
    distributed.stop(procs)
    return result

"""Training: a recipe's model on prepared token data, resumable, in one process or under torchrun.

One optimizer step takes micro_batch_size x grad_accum sequences in each of the world_size
processes: global window w of the data stream (gptzoo.training.data.Windows, a pure function of the seed)
goes to step w // G, where G is that global batch, and each process takes its contiguous slice of
the step's windows. The data position is therefore the step itself, and 1 process with
grad_accum 2 sees exactly the sequences that 2 processes with grad_accum 1 see.

Resuming continues bit for bit (on CPU in float32): weights, AdamW state, RNG states and the step
come back from the checkpoint, and the data and the learning rate are functions of the step.

Before the first step everything a person can get wrong is checked and refused with one message:
the data against the model (tokenizer, vocabulary, the largest token id), the memory a micro-batch
needs (:func:`memory_needed`), the run directory (locked against a second run, new or resumable),
and every field of the checkpoint resumed from. Ctrl-C ends a run with
:class:`gptzoo.errors.Interrupted`, saying the step reached and the checkpoint kept.
"""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptzoo.defaults import BY_NAME
from gptzoo.errors import CheckpointError, GptzooError, Interrupted, NonFiniteError, RecipeError, exception_text
from gptzoo.fetch import FETCHABLE
from gptzoo.flops import train_flops_per_token
from gptzoo.memory import available_bytes, format_bytes
from gptzoo.model.build import build_model
from gptzoo.model.checkpoint import RECIPE, WEIGHTS, read_recipe
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe, TrainSpec
from gptzoo.registry import Registry
from gptzoo.tokenizer import Tokenizer, load_tokenizer
from gptzoo.training import distributed, run_dir
from gptzoo.training.data import TokenData, Windows, eval_batches, n_windows, rank_slice, shown, vocab_sha256
from gptzoo.training.host_memory import keep_freed_memory
from gptzoo.training.loss import cross_entropy
from gptzoo.training.optim import lr_at, make_optimizer
from gptzoo.training.stats import StatWindow
from gptzoo.untrusted import check_utf8_path

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
    """Of the last logged window; None when it would exceed 1 (:func:`mfu_of`)."""
    skipped: int
    checkpoint: Path | None
    peak: Peak
    """What MFU divides by."""

    def summary(self, run: str | Path) -> dict[str, Any]:
        """The result as JSON data: a number that is not finite (a NaN loss, an infinite MFU) is null."""
        return {
            "run": str(run),
            "steps": self.steps,
            "loss": finite_or_none(self.loss),
            "val_loss": finite_or_none(self.val_loss),
            "tokens_per_s": finite_or_none(self.tokens_per_s),
            "mfu": finite_or_none(self.mfu),
            "peak": self.peak.as_json(),
            "skipped_steps": self.skipped,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
        }


def finite_or_none(value: Any) -> Any:
    """A float as JSON may hold it: NaN and infinities become null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


Log = Callable[[dict[str, Any]], None]
Started = Callable[[int], None]
"""Called with the step a run starts from, once every check has passed."""
Planned = Callable[["Plan"], None]
"""Called with what the run is about to do, just before ``Started``."""
Timed = Callable[["Timing"], None]
"""Called once, when the run has timed a step: the time left, from that step (gptzoo.training.trainer.Timing)."""
Stepped = Callable[[int], None]
"""Called with the step reached after each optimizer step (a progress display)."""


def seq_len_of(recipe: Recipe) -> int:
    return recipe.train.seq_len or recipe.model.context_length


def check_data(recipe: Recipe, data: TokenData, hf_dir: str | Path | None = None) -> None:
    """The data's tokenizer is the recipe's, and its ids fit the model's vocabulary: meta.json's tokenizer
    name and, where it records one and the recipe's tokenizer can be loaded (its "hf" one from ``hf_dir``),
    the sha256 of its vocabulary; meta.json's vocab_size, and the largest id actually in train.bin and
    val.bin (one pass over each)."""
    made_with, vocab, model_vocab = data.meta["tokenizer"], data.meta["vocab_size"], recipe.model.vocab_size
    name = made_with["name"]
    if recipe.tokenizer is not None:
        wanted = recipe.tokenizer.name
        if name != wanted:
            raise GptzooError(
                f"{data.path} was prepared with the {name!r} tokenizer, but recipe {recipe.name!r} uses {wanted!r}; "
                f"{_prepare_advice(recipe, hf_dir)}"
            )
        recorded = made_with.get("vocab_sha256")
        ours = _loadable(wanted, hf_dir) if recorded is not None else None
        if ours is not None and (digest := vocab_sha256(ours)) != recorded:
            theirs = f"of {made_with['directory']}" if isinstance(made_with.get("directory"), str) else f"{name!r}"
            mine = f"of {hf_dir}" if wanted == "hf" else f"{wanted!r}"
            raise GptzooError(
                f"{data.path} was prepared with the tokenizer {theirs}, whose vocabulary differs from that of the "
                f"tokenizer {mine} the model uses (vocab_sha256 {recorded[:12]}... in meta.json, {digest[:12]}... "
                f"here): the same ids are other tokens; {_prepare_advice(recipe, hf_dir)}"
            )
    if vocab > model_vocab:
        raise GptzooError(
            f"{data.path} was prepared for a vocabulary of {shown(vocab)} tokens (meta.json vocab_size), but the "
            f"model's vocab_size is {model_vocab}; use a recipe with vocab_size >= {shown(vocab)} or prepare the data "
            "with the recipe's tokenizer"
        )
    for split, tokens in (("train", data.train), ("val", data.val)):
        top = int(tokens.max())
        if top >= model_vocab:
            raise GptzooError(
                f"{data.path}: {split}.bin holds token id {top}, but the model's vocab_size is {model_vocab} (ids "
                f"0..{model_vocab - 1}); the data is damaged or made for another tokenizer: prepare it again"
            )
        if top >= vocab:
            raise GptzooError(
                f"{data.path}: {split}.bin holds token id {top}, beyond meta.json's vocab_size {vocab}; the data is "
                "damaged: prepare it again"
            )


def _loadable(name: str, hf_dir: str | Path | None) -> Tokenizer | None:
    """The tokenizer a recipe names, if it can be loaded here: "hf" from ``hf_dir`` only."""
    if name == "hf" and hf_dir is None:
        return None
    try:
        return load_tokenizer(name, hf_dir=hf_dir)
    except GptzooError:  # an HF directory without a tokenizer, GPT-2's BPE files not installed: nothing to compare
        return None


def _prepare_advice(recipe: Recipe, hf_dir: str | Path | None) -> str:
    """How to prepare data for ``recipe``'s tokenizer: by name, or the Hugging Face directory that holds it."""
    assert recipe.tokenizer is not None
    source: str | Path | None = recipe.tokenizer.name
    if source == "hf":  # not a name prepare takes: the directory of the weights it comes with, where known
        weights = recipe.weights.hf if recipe.weights is not None else None
        if hf_dir is not None:
            source = Path(hf_dir).resolve()
        elif weights is not None and (weights in FETCHABLE or Path(weights).expanduser().is_dir()):
            source = weights
        else:
            source = None
    if source is not None:
        return f"run `gptzoo prepare ... --tokenizer {source}` for it"
    return (
        "its 'hf' tokenizer is the one of the Hugging Face weights it starts from: run `gptzoo prepare ... "
        "--tokenizer DIR` with their directory DIR, and train with --init-from-hf DIR"
    )


def memory_needed(recipe: Recipe, n_params: int) -> tuple[int, int]:
    """(bytes one process needs to train ``recipe``, bytes of one micro-batch's float32 logits): a rough estimate.

    16 bytes per parameter (float32 weights, gradients and AdamW's two moments), plus per token of a
    micro-batch (micro_batch_size x seq_len): the float32 logits three times (the logits, their
    log-softmax, its gradient: 12 x vocab_size bytes), and the activations kept for the backward
    pass, about 17 x n_embd values per layer (Korthikanti et al. 2022, without the attention scores
    that fused attention does not store) in 4 bytes, 2 under autocast. Evaluation needs less.
    """
    m = recipe.model
    tokens = recipe.train.micro_batch_size * seq_len_of(recipe)
    logits = tokens * m.vocab_size * 4
    activation_bytes = 4 if recipe.train.precision == "float32" else 2
    return 16 * n_params + 3 * logits + tokens * m.n_layer * 17 * m.n_embd * activation_bytes, logits


def check_memory(recipe: Recipe, device: torch.device, registry: Registry | None = None) -> None:
    """Refuse a model or micro-batch that cannot fit in the memory available (to each process on this machine)."""
    n_params = sum(p.numel() for p in build_model(recipe, device="meta", registry=registry).parameters())
    need, logits = memory_needed(recipe, n_params)
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    free = available_bytes(device)
    have = free // max(1, sharing) if free is not None else None
    if have is None or need <= have:
        return
    if 16 * n_params > have:
        raise GptzooError(
            f"the model's {n_params:,} parameters need {format_bytes(16 * n_params)} for their weights, gradients "
            f"and AdamW state, but {format_bytes(have)} of memory is available; train a smaller model "
            "(model.n_layer, model.n_embd)"
        )
    raise GptzooError(
        f"train.micro_batch_size={recipe.train.micro_batch_size} x seq_len={seq_len_of(recipe)} needs about "
        f"{format_bytes(need)} of memory to train (the float32 logits alone take {format_bytes(logits)}), but "
        f"{format_bytes(have)} is available; lower train.micro_batch_size (raising train.grad_accum keeps the "
        "batch) or train.seq_len"
    )


def check_resumable(recipe: Recipe, saved: Recipe, where: Path) -> None:
    """The checkpoint trained this recipe: same model, same math (lr, batch, schedule, seed...)."""
    problems = []
    for section in ("model", "tokenizer"):
        theirs, ours = saved.to_dict().get(section) or {}, recipe.to_dict().get(section) or {}
        problems += [
            f"[{section}] {key} is {_setting(theirs, key)} there, {_setting(ours, key)} here"
            for key in dict.fromkeys([*theirs, *ours])
            if theirs.get(key, _UNSET) != ours.get(key, _UNSET)
        ]
    for f in fields(TrainSpec):
        ours, theirs = getattr(recipe.train, f.name), getattr(saved.train, f.name)
        if f.name == "seq_len":
            ours, theirs = seq_len_of(recipe), seq_len_of(saved)
        if f.name not in RESUMABLE_CHANGES and ours != theirs:
            problems.append(f"[train] {f.name} is {theirs!r} there, {ours!r} here")
    if problems:
        raise CheckpointError(
            f"{where} is a checkpoint of a different recipe: {'; '.join(problems)}; resume with the run's own recipe "
            f"({where.parent.parent / RECIPE}) or start a new --out"
        )


_UNSET = object()


def _setting(section: dict[str, Any], key: str) -> str:
    """A recipe value in a message, as its TOML gives it: its repr, cut after 60 characters; or unset."""
    if key not in section:
        return "unset"
    text = repr(section[key])
    return text if len(text) <= 60 else text[:57] + "..."


def precision_dtype(precision: str) -> torch.dtype:
    """train.precision -> the dtype its matmuls run in (gptzoo.defaults.TABLE)."""
    return getattr(torch, BY_NAME[precision].dtype)


@contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """The forward pass's context: nothing for float32, torch.autocast to the precision otherwise."""
    if precision == "float32":
        yield
        return
    with torch.autocast(device.type, dtype=precision_dtype(precision)):
        yield


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU divides by, and where the figure comes from (``--json``'s ``peak``)."""

    flops_per_s: float
    source: str

    def as_json(self) -> dict[str, Any]:
        return {"flops_per_s": self.flops_per_s, "source": self.source}


@dataclass(frozen=True)
class Plan:
    """What a run is about to do, said before its first step (`gptzoo train`'s start line)."""

    out: Path
    step: int
    """Where it starts: 0, or a resumed checkpoint's step."""
    steps: int
    tokens_per_step: int
    seconds: float
    """The estimated time to ``steps``: at the tokens/s a resumed run last logged, else at ASSUMED_MFU of the peak."""
    basis: str
    """Where ``seconds`` comes from, in words."""


@dataclass(frozen=True)
class Timing:
    """The time a run has left, from a step it timed (the second this process ran: the first warms up), said
    once: the FLOPs of :class:`Plan`'s estimate miss what a model spends beyond its matmuls (an eager or
    sequential component, small kernels' overhead, the evaluations)."""

    step: int
    step_seconds: float
    """What that step took."""
    seconds: float
    """The time left: the steps left at ``step_seconds`` each, and the evaluations left at :attr:`eval_seconds`."""
    elapsed: float
    """The run's time so far (this process's)."""
    evals: int
    """The evaluations left."""
    eval_seconds: float
    """One evaluation's time: the one at step 0 timed, else its forward passes at a third of a step's per token."""
    estimate: float
    """What :class:`Plan` said before the first step."""


ASSUMED_MFU = 0.3
"""The share of the peak (:class:`Peak`) a new run's time is estimated at before it has measured its own speed:
small models on CPUs reach 0.1 to 0.6 of a measured peak, so the estimate is good to a factor of 2 or 3."""


def plan_of(trainer: Trainer) -> Plan:
    """The run ``trainer`` is about to train: a resumed one at its last logged speed, a new one at ASSUMED_MFU."""
    spec, per_step = trainer.spec, trainer.global_batch * trainer.seq_len
    left = max(0, spec.max_steps - trainer.step) * per_step
    logged = [r["tokens_per_s"] for r in run_dir.read_metrics(trainer.out) if r.get("tokens_per_s")]
    if trainer.step and logged:
        seconds, basis = left / logged[-1], f"at the {logged[-1]:,.0f} tokens/s it last logged"
    else:
        procs = trainer.procs.world_size  # each process reaches its own peak
        rate = ASSUMED_MFU * trainer.peak.flops_per_s * procs / trainer.flops_per_token
        peak = trainer.peak.flops_per_s
        shown = f"{peak / 1e12:.3g} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.3g} GFLOP/s"
        shown += f" in each of {procs} processes" if procs > 1 else ""
        seconds, basis = left / rate, f"at {ASSUMED_MFU:.0%} of the peak {shown}"
    return Plan(trainer.out, trainer.step, spec.max_steps, per_step, seconds, basis)


PEAK_TRIALS = 3
"""Timed matmuls of the measured peak (the fastest counts: other work on the cores only slows one)."""


def peak_of(spec: TrainSpec, device: torch.device) -> Peak:
    """``[train] peak_tflops`` when the recipe gives it, else the FLOP/s of a large matmul in the
    training precision measured now (:func:`measure_peak_flops`)."""
    if spec.peak_tflops:
        return Peak(spec.peak_tflops * 1e12, f"[train] peak_tflops = {spec.peak_tflops:g}")
    n = matmul_size(device)
    measured = measure_peak_flops(device, spec.precision)
    return Peak(measured, f"measured at start-up: the fastest of {PEAK_TRIALS} {n}x{n} {spec.precision} matmuls")


def mfu_of(flops_per_s: float, peak: Peak) -> float | None:
    """The model FLOPs utilization, or None when it would exceed 1: then the peak is too low (measured
    while other work had the cores, or a [train] peak_tflops below the device's), and no figure is honest."""
    mfu = flops_per_s / peak.flops_per_s
    return mfu if mfu <= 1 else None


def matmul_size(device: torch.device) -> int:
    return 8192 if device.type == "cuda" else 2048


def measure_peak_flops(device: torch.device, precision: str) -> float:
    """FLOP/s of a large matmul in the training precision: the peak MFU is measured against."""
    dtype = precision_dtype(precision)
    n = matmul_size(device)
    generator = torch.Generator(device=device).manual_seed(0)  # the global RNG is the run's, not this probe's
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    a @ b  # warm-up
    best = math.inf
    for _ in range(PEAK_TRIALS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in float32 (:func:`gptzoo.training.loss.cross_entropy`)."""
    return cross_entropy(model(x), y)


def mean_loss(
    forward: Callable[[torch.Tensor], torch.Tensor],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    precision: str,
    device: torch.device,
) -> torch.Tensor:
    """The mean of the batches' losses, as a run's evaluation computes it (see :func:`validation_loss`)."""
    total = torch.zeros((), device=device)
    for x, y in batches:
        with autocast(precision, device):
            total += loss_of(forward, x.to(device), y.to(device))
    return total / len(batches)


@torch.no_grad()
def validation_loss(model: GPT, recipe: Recipe, data: TokenData) -> float:
    """The validation loss a run of ``recipe`` logs, of ``model`` (in one process): the first eval_batches
    batches of val.bin, as :meth:`Trainer.evaluate` reads them."""
    spec = recipe.train
    batches = list(eval_batches(data.val, seq_len_of(recipe), spec.micro_batch_size, spec.eval_batches))
    model.eval()
    return float(mean_loss(model, batches, spec.precision, next(model.parameters()).device))


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
        registry: Registry | None = None,
    ) -> None:
        self.recipe, self.spec, self.out, self.procs, self.log = recipe, recipe.train, out, procs, log
        self.registry = registry
        self.seq_len = seq_len_of(recipe)
        spec = self.spec
        self.global_batch = spec.micro_batch_size * spec.grad_accum * procs.world_size
        self.windows = Windows(data.train, self.seq_len, spec.seed)
        self.val = data.val
        n_windows(self.val, self.seq_len)  # val.bin must hold a window: say so now, not at the first evaluation
        self.peak = peak_of(spec, procs.device)
        if procs.device.type == "cpu":
            keep_freed_memory()  # every step reallocates the same tensors: reuse their pages (host_memory)
        torch.manual_seed(spec.seed)
        model = init if init is not None else build_model(recipe, registry=registry)
        self.model = model.to(procs.device)
        parameters = dict(self.model.named_parameters())
        trainable = frozenset(name for name, p in parameters.items() if p.requires_grad)
        self.saved: frozenset[str] | None = trainable if len(trainable) < len(parameters) else None
        """With frozen parameters (adapters on a frozen base: gptzoo.adapters), the names of the trainable ones,
        all that a checkpoint holds: the frozen ones come from where the model did. None: everything is saved."""
        self.step = 0
        self.skipped = 0
        self.aux: dict[str, float] = {}
        """The auxiliary losses of the latest step (aux_NAME: the mean over its micro-batches), for its record."""
        self.reports_aux = bool(self.model.declaring("aux_losses"))
        """Whether a component reports auxiliary losses: found once, not by walking the modules every micro-batch."""
        self.stats = StatWindow(self.model.stat_reporters())
        """The components' statistics since the last record (contract 5), found once."""
        self.resumed_from: Path | None = None
        state: dict[str, Any] | None = None
        if resume:
            state = self._load_latest()
        self.shared = distributed.replicate(self.model, procs, spec.parallel)
        self.optimizer = make_optimizer(self.shared, spec)
        self.scaler = torch.amp.GradScaler("cuda") if spec.precision == "float16" else None
        if state is not None:
            self._restore(state)
        self.forward = torch.compile(self.shared) if spec.compile else self.shared  # compiles at the first step
        self.flops_per_token = train_flops_per_token(self.model, self.seq_len)

    # --- checkpoints -------------------------------------------------------------------------

    def _load_latest(self) -> dict[str, Any]:
        path = run_dir.latest(self.out)
        if path is None:
            raise CheckpointError(f"{self.out} has no checkpoint to resume from; train without --resume to start it")
        self.resumed_from = path
        try:
            saved = read_recipe(path, registry=self.registry)
        except RecipeError as exc:
            raise self._corrupt(str(exc)) from None
        check_resumable(self.recipe, saved, path)
        tensors, state = run_dir.load(path)
        if state["world_size"] != self.procs.world_size:
            raise CheckpointError(
                f"{path} was trained by {state['world_size']} process(es), this run has {self.procs.world_size}: the "
                f"global batch (micro_batch_size x grad_accum x processes) would change; resume with "
                f"{state['world_size']}, or adjust train.grad_accum in a new run"
            )
        if state["step"] >= self.spec.max_steps:
            raise CheckpointError(
                f"{path} has already trained {state['step']} of max_steps={self.spec.max_steps}; raise train.max_steps "
                "(--set train.max_steps=N) to train further"
            )
        self._check_tensors(tensors)
        self.model.load_weights({k: v.to(self.procs.device) for k, v in tensors.items()}, source=str(path))
        self.step, self.skipped = state["step"], state.get("skipped", 0)
        return state

    def begin(self) -> None:
        """Make the run directory this run's: the first change on disk, once every check has passed. A
        resumed run forgets the metrics after its checkpoint and what killed saves left."""
        if self.resumed_from is not None:
            run_dir.truncate_metrics(self.out, self.step)
            run_dir.remove_partial(self.out)
        run_dir.write_text_atomically(self.out / RECIPE, self.recipe.to_toml())

    def _corrupt(self, problem: str) -> CheckpointError:
        path = self.resumed_from
        return CheckpointError(
            f"the checkpoint {path} cannot be resumed: {problem}; "
            f"move {path} away to resume from an earlier checkpoint, or start a new --out"
        )

    def _check_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """The checkpoint's weights are the model's: the same names, shapes and dtypes."""
        ours = {k: v for k, v in self.model.state_dict().items() if not (self.model.tied and k == "lm_head.weight")}
        if self.saved is not None:
            ours = {k: v for k, v in ours.items() if k in self.saved}
        if self.model.tied:
            tensors.pop("lm_head.weight", None)
        missing, unexpected = sorted(ours.keys() - tensors.keys()), sorted(tensors.keys() - ours.keys())
        if missing or unexpected:
            raise self._corrupt(f"{WEIGHTS} lacks {missing[:3]} and has unexpected {unexpected[:3]}")
        for key, param in ours.items():
            if tensors[key].shape != param.shape or tensors[key].dtype != param.dtype:
                raise self._corrupt(
                    f"{WEIGHTS}: {key} is {tensors[key].dtype} {tuple(tensors[key].shape)}, the model's is "
                    f"{param.dtype} {tuple(param.shape)}"
                )

    def _optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint's AdamW state, every field checked against this model and this optimizer (made from
        the recipe, whose hyper-parameters it keeps): see run_dir.optimizer_state."""
        restored = run_dir.optimizer_state(
            state["optimizer"],
            self.optimizer.param_groups,
            dict(self.model.named_parameters()),
            applied=state["step"] - state.get("skipped", 0),
            every_step=self.scaler is None,
        )
        if isinstance(restored, str):
            assert self.resumed_from is not None
            raise run_dir.corrupt(self.resumed_from, restored)
        return restored

    def _restore(self, state: dict[str, Any]) -> None:
        """The optimizer, RNG and loss-scaler states of a checkpoint (checked by run_dir.load)."""
        optim_state = self._optimizer_state(state)
        try:
            self._set_optimizer_state(optim_state)
            torch.set_rng_state(state["rng"]["cpu"])
            if self.procs.device.type == "cuda" and "cuda" in state["rng"]:
                torch.cuda.set_rng_state(state["rng"]["cuda"], self.procs.device)
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise self._corrupt(f"its state cannot be restored ({type(exc).__name__}: {exc})") from None

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
        if self.saved is not None:
            model_state = {k: v for k, v in model_state.items() if k in self.saved}
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
                f"after step {self.step} the weights {broken[:3]} hold non-finite values; nothing of step "
                f"{self.step} was saved, {self._kept()}; start a new run with a lower train.lr or in float32"
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
        aux_total: dict[str, torch.Tensor] = {}
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
                reported = self.model.aux_losses() if self.reports_aux else {}
                aux = {name: value / spec.grad_accum for name, value in reported.items()}
                objective = loss + spec.aux_loss_weight * sum(aux.values()) if aux else loss
                self.stats.add()
            (self.scaler.scale(objective) if self.scaler is not None else objective).backward()
            total += loss.detach()
            for name, value in aux.items():
                aux_total[name] = aux_total.get(name, 0) + value.detach().float()
        self.aux = {f"aux_{name}": float(distributed.mean(value, self.procs)) for name, value in aux_total.items()}
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
            what, value = ("loss", loss_value) if not math.isfinite(loss_value) else ("gradient norm", norm_value)
            if run_dir.latest(self.out) is None:
                kept = (
                    f"{self._kept()}: train again with a lower train.lr, in float32, or with --set "
                    "train.on_nonfinite=skip"
                )
            else:
                kept = (
                    f"nothing was saved for this step, {self._kept()}: resume with --resume --set "
                    "train.on_nonfinite=skip to skip such steps, or start a new run with a lower train.lr or in float32"
                )
            raise NonFiniteError(f"step {self.step + 1}: the {what} is {value}; {kept}")
        elif self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if not finite:
            self.skipped += 1
        return loss_value, norm_value, finite

    def _kept(self) -> str:
        """What a run that fails now leaves: its newest checkpoint, or nothing (train() discards a new run's files)."""
        last = run_dir.latest(self.out)
        return (
            f"the last checkpoint {last} is intact" if last else "no checkpoint had been written, so nothing was kept"
        )

    @contextmanager
    def _compile_errors(self) -> Iterator[None]:
        """torch.compile's failures (it compiles at the first step, and again to evaluate) as one message."""
        if not self.spec.compile:
            yield
            return
        from torch._dynamo.exc import BackendCompilerFailed

        try:
            yield
        except BackendCompilerFailed as exc:
            inner = getattr(exc, "inner_exception", None) or exc  # what the backend (inductor) raised
            line = " ".join(f"{type(inner).__name__}: {exception_text(inner)}".split())
            again = "resume with --resume" if run_dir.latest(self.out) else "train again with"
            raise GptzooError(
                f"torch.compile failed ({line}); {self._kept()}: {again} --set train.compile=false"
            ) from exc

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
        loss = mean_loss(self.forward, mine, self.spec.precision, self.procs.device)
        self.shared.train()
        return float(distributed.mean(loss, self.procs))

    def timing(self, step_seconds: float, eval_seconds: float | None, elapsed: float, estimate: float) -> Timing:
        """The time left after the step just run took ``step_seconds`` (:class:`Timing`)."""
        spec, step, every = self.spec, self.step, self.spec.eval_every
        if every:  # the multiples of eval_every from this step (its evaluation comes after) on, and the last step
            evals = spec.max_steps // every - (step - 1) // every + (spec.max_steps % every != 0)
        else:
            evals = 1
        if eval_seconds is None:
            tokens = spec.eval_batches * spec.micro_batch_size * self.seq_len
            eval_seconds = step_seconds * tokens / (3 * self.global_batch * self.seq_len)
        left = (spec.max_steps - step) * step_seconds + evals * eval_seconds
        return Timing(step, step_seconds, left, elapsed, evals, eval_seconds, estimate)

    def run(
        self,
        stepped: Stepped | None = None,
        *,
        evaluate_first: bool = False,
        timed: Timed | None = None,
        estimate: float = math.nan,
    ) -> TrainResult:
        """Train to max_steps; ``evaluate_first``: a new run logs the validation loss of its starting weights
        as step 0 (what fine-tuning improves on); ``timed`` hears, once, the time left from the second step
        this process runs (:meth:`timing`; ``estimate``: the plan's, before the first step)."""
        spec = self.spec
        loss, val_loss, checkpoint = math.nan, None, None
        began, eval_seconds = time.perf_counter(), None
        timed_at = self.step + 2 if timed is not None and spec.max_steps - self.step > 2 else None
        if evaluate_first and self.step == 0:
            with self._compile_errors():
                first = self.evaluate()
            eval_seconds = time.perf_counter() - began
            self.log({"step": 0, "val_loss": first, "val_ppl": math.exp(min(first, 700)), "time": time.time()})
        self.shared.train()
        tokens_per_step = self.global_batch * self.seq_len
        window_steps, window_time = 0, 0.0
        tokens_per_s, mfu = 0.0, None
        with self._compile_errors():  # it compiles at the first step, and again to evaluate
            while self.step < spec.max_steps:
                start = time.perf_counter()
                loss, norm, applied = self.train_step()
                took = time.perf_counter() - start
                window_time += took
                window_steps += 1
                if stepped is not None:
                    stepped(self.step)
                if self.step == timed_at and timed is not None:
                    timed(self.timing(took, eval_seconds, time.perf_counter() - began, estimate))
                step, last = self.step, self.step == spec.max_steps
                if step % spec.log_every == 0 or last or not applied:
                    tokens_per_s = window_steps * tokens_per_step / window_time
                    mfu = mfu_of(tokens_per_s * self.flops_per_token / self.procs.world_size, self.peak)
                    self.log(
                        {
                            "step": step,
                            "loss": loss,
                            "lr": lr_at(step - 1, spec),
                            "grad_norm": norm,
                            "tokens_per_s": tokens_per_s,
                            "mfu": mfu,
                            "skipped": not applied,
                            **self.aux,
                            **self.stats.flush(self.procs),
                            "time": time.time(),
                        }
                    )
                    window_steps, window_time = 0, 0.0
                # a step's metrics are on disk before its checkpoint: a kill between the two resumes from the
                # checkpoint before, which forgets those records and logs them again (begin)
                if (spec.eval_every and step % spec.eval_every == 0) or last:
                    val_loss = self.evaluate()
                    self.log(
                        {
                            "step": step,
                            "val_loss": val_loss,
                            "val_ppl": math.exp(min(val_loss, 700)),
                            "time": time.time(),
                        }
                    )
                if (spec.checkpoint_every and step % spec.checkpoint_every == 0) or last:
                    checkpoint = self.save() or checkpoint
        return TrainResult(self.step, loss, val_loss, tokens_per_s, mfu, self.skipped, checkpoint, self.peak)


def check_out(out: Path, *, resume: bool) -> None:
    """--out is a run with checkpoints to resume, or (without --resume) new or empty (but for its lock);
    its name is one safetensors can write checkpoints under."""
    check_utf8_path(out)
    if resume:
        run_dir.check_checkpoints(out)
        if not run_dir.checkpoint_dirs(out):
            raise GptzooError(
                f"{out} has no checkpoints to resume; check --out, or remove {out} and train without --resume"
            )
    elif run_dir.others(out):
        raise GptzooError(f"{out} already holds files; pass --resume to continue that run, or choose another --out")


PREPARED = "the directory `gptzoo prepare --out DIR` wrote"


def data_dir_of(recipe: Recipe, data: str | Path | None) -> Path:
    """The prepared data, as an absolute path: ``data`` (--data, relative to here), else the recipe's train.data
    (relative to its recipe file when a file set it, see gptzoo.recipe.load; else to here)."""
    if data is not None:
        if not str(data):
            raise GptzooError(f"--data is empty; give {PREPARED}")
        return _resolved(Path(data), f"--data {data}")
    if recipe.train.data:
        return _resolved(Path(recipe.train.data), f"train.data {recipe.train.data}")
    raise GptzooError(
        f"no training data: pass --data DIR (made by `gptzoo prepare`), or set train.data in {recipe.source}"
    )


def _resolved(path: Path, named: str) -> Path:
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # a symbolic link loop: RuntimeError before Python 3.13, then ELOOP
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise GptzooError(f"cannot use {named}: {exc.strerror}; give {PREPARED}") from None
        raise GptzooError(f"{named} leads into a loop of symbolic links; give {PREPARED}") from None


def check_compile(device: torch.device) -> None:
    """train.compile on CPU: torch.compile's C++ compiler is there (torch looks for $CXX, else g++). On a GPU
    it writes Triton kernels; a failure there is reported when it compiles, at the first step."""
    if device.type != "cpu":
        return
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler as exc:
        raise GptzooError(
            f"train.compile = true needs a working C++ compiler on CPU ({exc}); install one (g++), point $CXX at it, "
            "or set train.compile=false"
        ) from None


def train(
    recipe: Recipe,
    *,
    out: str | Path,
    data: str | Path | None = None,
    resume: bool = False,
    init: GPT | None = None,
    hf_dir: str | Path | None = None,
    log: Log | None = None,
    started: Started | None = None,
    stepped: Stepped | None = None,
    registry: Registry | None = None,
    planned: Planned | None = None,
    timed: Timed | None = None,
    evaluate_first: bool = False,
) -> TrainResult:
    """Train ``recipe`` (from ``init``'s weights when given) into the run directory ``out``; every
    record also goes to ``log``, ``started`` learns the step the run starts from once every check
    has passed, and ``stepped`` each step reached after it; ``planned``, just before, what the run is about
    to do (:class:`Plan`: steps, tokens, the estimated time; in the first process only), and ``timed``, once,
    the time left from a step timed (:class:`Timing`; in the first process only); ``evaluate_first``
    logs the validation loss of a new run's starting weights as step 0. Under torchrun,
    call it in every process (the first one holds the lock).
    ``hf_dir``: the Hugging Face directory ``init`` came from, whose tokenizer is a recipe's "hf" one
    (the data's is checked against it). ``registry`` builds the model (default:
    gptzoo.registry.default_registry()).

    Nothing changes on disk before every check has passed. A new run that fails or is interrupted
    before its first checkpoint removes what it wrote (there is nothing to resume), so it can simply
    run again.

    Raises:
        GptzooError: bad input, found before the first step; or a failure while training (the message says what
            was kept).
        Interrupted: Ctrl-C; its message says the step reached and the last complete checkpoint.
    """
    if not str(out):
        raise GptzooError("--out is empty; give the run directory (by default runs/RECIPE)")
    out = Path(out)
    procs = distributed.start()
    trainer: Trainer | None = None
    try:
        if recipe.train.precision == "float16" and procs.device.type != "cuda":
            raise GptzooError(
                "train.precision = 'float16' needs a CUDA GPU (its loss scaling is for GPUs); use 'bfloat16' or "
                "'float32'"
            )
        data_dir = data_dir_of(recipe, data)
        tokens = TokenData.open(data_dir)
        check_data(recipe, tokens, hf_dir)
        check_memory(recipe, procs.device, registry)
        if recipe.train.compile:
            check_compile(procs.device)
        recipe = replace(recipe, train=replace(recipe.train, data=str(data_dir)))  # RUN/recipe.toml works from anywhere

        def record(entry: dict[str, Any]) -> None:
            if procs.is_main:
                entry = {k: finite_or_none(v) for k, v in entry.items()}  # JSON has no NaN
                run_dir.append_metrics(out, entry)
                if log is not None:
                    log(entry)

        with run_dir.locked(out) if procs.is_main else nullcontext():  # the run directory appears here
            distributed.agree(procs, lambda: check_out(out, resume=resume))  # the others would race its writes
            trainer = Trainer(recipe, tokens, out, procs, resume=resume, init=init, log=record, registry=registry)
            try:
                plan = None
                if procs.is_main:
                    trainer.begin()
                    plan = plan_of(trainer)
                    if planned is not None:
                        planned(plan)
                if started is not None:
                    started(trainer.step)
                estimate = math.nan if plan is None else plan.seconds
                timing = timed if procs.is_main else None
                result = trainer.run(stepped, evaluate_first=evaluate_first, timed=timing, estimate=estimate)
            except BaseException:  # Ctrl-C too
                if procs.is_main and not resume:
                    run_dir.discard(out)  # nothing to resume: leave nothing that refuses the next try
                raise
    except run_dir.WriteError as exc:
        distributed.stop(procs, wait=False)
        raise run_dir.WriteError(f"{exc}; {run_dir.intact(out)}") from None
    except KeyboardInterrupt:
        distributed.stop(procs, wait=False)
        if trainer is None and not resume:
            raise Interrupted("before the first step; nothing was written") from None
        reached = f"at step {trainer.step}" if trainer is not None else "before the first step"
        raise Interrupted(f"{reached}; {run_dir.kept(out)}") from None
    except BaseException:
        distributed.stop(procs, wait=False)
        raise
    distributed.stop(procs)
    return result

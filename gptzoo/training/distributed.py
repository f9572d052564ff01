"""Processes under torchrun: which one this is, its device, and how the model is replicated.

Without torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) this is a single process on the GPU
if there is one, else the CPU. Under torchrun each process joins a process group (nccl on CUDA,
gloo on CPU) and the model is wrapped with DDP (a full replica per process, gradients averaged) or
FSDP2 (``fully_shard``: parameters, gradients and optimizer state sharded across processes, each
block gathered only while it runs), as the recipe's ``train.parallel`` says.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from gptzoo.errors import GptzooError


@dataclass(frozen=True)
class Processes:
    rank: int
    world_size: int
    device: torch.device
    owns_group: bool = False
    """This call of :func:`start` joined the process group, so :func:`stop` leaves it; a caller that
    joined first (a sweep running many trainings) keeps it for the next."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def start() -> Processes:
    """This process's place: joins the process group when launched by torchrun with several."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world_size == 1:
        return Processes(0, 1, torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=device if cuda else None)
    return Processes(dist.get_rank(), dist.get_world_size(), device, owns)


def stop(procs: Processes, *, wait: bool = True) -> None:
    """``wait`` for the other processes (not when this one is failing), and leave the process group if
    this one's :func:`start` joined it."""
    if procs.distributed and dist.is_initialized():
        if wait:
            dist.barrier()
        if procs.owns_group:
            dist.destroy_process_group()


def barrier(procs: Processes) -> None:
    """Wait until every process gets here."""
    if procs.distributed:
        dist.barrier()


def share(value: object, procs: Processes) -> object:
    """The first process's ``value``, in every process (a picklable object)."""
    if not procs.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def agree(procs: Processes, *checks: Callable[[], object]) -> None:
    """Run the checks in the first process, which owns the run directory; every process raises its error.
    (Checking for themselves, the others would race its first writes there.)"""
    problem = None
    if procs.is_main:
        try:
            for check in checks:
                check()
        except GptzooError as exc:
            problem = exc
    shared = share(None if problem is None else str(problem), procs)
    if problem is not None:
        raise problem
    if shared is not None:
        raise GptzooError(str(shared))


def replicate(model: nn.Module, procs: Processes, parallel: str) -> nn.Module:
    """The model as the processes share it: itself alone, DDP, or FSDP2 (each block, then the rest)."""
    if not procs.distributed:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:  # type: ignore[attr-defined]
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[procs.device.index] if procs.device.type == "cuda" else None)


def mean(value: torch.Tensor, procs: Processes) -> torch.Tensor:
    """The average of a tensor over the processes."""
    if procs.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= procs.world_size
    return value

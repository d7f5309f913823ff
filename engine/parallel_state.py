"""Tensor-parallel process groups: this rank, the world, and the collectives the model uses.

torch.distributed carries everything: NCCL for the data plane on CUDA (activations), gloo for
the control plane (the per-step scheduling decision, start-up numbers), which is also the
data plane on the CPU. A process holds at most one tensor-parallel group at a time (it is
torch.distributed's default group), so one engine with tensor_parallel_size > 1 per process.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# How long a rank waits in a collective (and at start-up for the others to join) before
# giving up: loading a large checkpoint from a slow disk fits well within it.
GROUP_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass
class ParallelState:
    """Where this process sits in the tensor-parallel group. world_size 1: no collectives."""

    rank: int = 0
    world_size: int = 1
    device_group: Any = None  # activations: NCCL on CUDA, gloo on the CPU
    cpu_group: Any = None  # control plane: always gloo

    @property
    def is_first(self) -> bool:
        """Rank 0: the one that schedules, samples and talks to the user."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place (row-parallel outputs, vocab-parallel lookups)."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    def gather_to_first(self, x: torch.Tensor) -> torch.Tensor | None:
        """Concatenate every rank's x along the last dim on rank 0; None on the others."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_first else None
        dist.gather(x, parts, dst=0, group=self.device_group)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's obj on every rank (pickled over the gloo group)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out


def rendezvous_store(world_size: int) -> dist.TCPStore:
    """Rank 0's key-value store on a free loopback port; the workers connect to its port."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=GROUP_TIMEOUT,
                         wait_for_workers=False)


def join_store(port: int, world_size: int) -> dist.TCPStore:
    """A worker's connection to rank 0's store."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=GROUP_TIMEOUT)


def init_parallel_state(store: dist.Store, rank: int, world_size: int,
                        device: torch.device) -> ParallelState:
    """Join the group (blocks until every rank has joined)."""
    if dist.is_initialized():
        raise RuntimeError("This process already holds a tensor-parallel group: one engine "
                           "with tensor_parallel_size > 1 per process; close the other first.")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=GROUP_TIMEOUT)
    world = dist.group.WORLD
    cpu_group = world if backend == "gloo" else dist.new_group(backend="gloo",
                                                               timeout=GROUP_TIMEOUT)
    return ParallelState(rank, world_size, world, cpu_group)


def destroy_parallel_state() -> None:
    """Leave the group (idempotent), so the process can build another engine."""
    if dist.is_initialized():
        dist.destroy_process_group()

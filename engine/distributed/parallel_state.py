"""Tensor-parallel process groups: this rank, the world, and the collectives the model uses.

torch.distributed carries everything: NCCL for the data plane on CUDA (activations), gloo for
the control plane (the per-step scheduling decision, start-up numbers), which is also the
data plane on the CPU. The groups are built from the engine's own rendezvous store rather
than as torch.distributed's process-wide default group, so that one process can hold several
CPU engines in turn or at once (tests do); NCCL still goes through the default group, the
path torch supports best, so on CUDA it is one tensor-parallel engine per process.
"""

from __future__ import annotations

import datetime
import pickle
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
    owns_default_group: bool = False  # NCCL: torch.distributed's default group is ours

    @property
    def is_first(self) -> bool:
        """Rank 0: the one that schedules, samples and talks to the user."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place (row-parallel outputs, vocab-parallel lookups)."""
        if self.world_size > 1:
            self.device_group.allreduce([x]).wait()
        return x

    def gather_to_first(self, x: torch.Tensor) -> torch.Tensor | None:
        """Concatenate every rank's x along the last dim on rank 0; None on the others."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_first else []
        opts = dist.GatherOptions()
        opts.rootRank = 0
        self.device_group.gather([parts] if parts else [], [x], opts).wait()
        return torch.cat(parts, dim=-1) if parts else None

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's obj on every rank: pickled, its length then its bytes over gloo."""
        if self.world_size == 1:
            return obj
        if self.is_first:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        self._broadcast(size)
        if not self.is_first:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(data)
        return obj if self.is_first else pickle.loads(data.numpy().tobytes())

    def all_gather_int(self, value: int) -> list[int]:
        """Every rank's value, in rank order, on every rank."""
        if self.world_size == 1:
            return [value]
        out = [torch.empty(1, dtype=torch.long) for _ in range(self.world_size)]
        self.cpu_group.allgather([out], [torch.tensor([value], dtype=torch.long)]).wait()
        return [int(t.item()) for t in out]

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.cpu_group.broadcast([t], opts).wait()

    def destroy(self) -> None:
        """Leave the group (idempotent)."""
        if self.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
        self.device_group = self.cpu_group = None
        self.owns_default_group = False


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
    cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size,
                                      GROUP_TIMEOUT)
    if device.type != "cuda":
        return ParallelState(rank, world_size, cpu_group, cpu_group)
    if dist.is_initialized():
        raise RuntimeError("This process already runs a CUDA engine with tensor parallelism: "
                           "one per process; close the other first.")
    dist.init_process_group("nccl", store=dist.PrefixStore("nccl", store), rank=rank,
                            world_size=world_size, timeout=GROUP_TIMEOUT)
    return ParallelState(rank, world_size, dist.group.WORLD, cpu_group, owns_default_group=True)

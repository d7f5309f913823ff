"""MultiprocExecutor: rank 0's handle on the other tensor-parallel ranks.

The engine process is rank 0 (it schedules, runs its own shard and samples); ranks 1..tp-1
are processes started here (spawn: CUDA cannot be forked), each running
engine.worker.tp_worker.worker_main. Each step rank 0 broadcasts the compact StepBatch
(token ids, positions, slot mapping, block tables) over the gloo group, then every rank runs
the same forward.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
import weakref
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch.distributed as dist

from officellm.engine.config import LOWER_TIER_NEEDS_ONE_RANK, EngineConfig
from officellm.engine.core.scheduler_output import SamplerOutput, SchedulerOutput
from officellm.engine.distributed.parallel_state import (
    ParallelState,
    init_parallel_state,
    rendezvous_store,
)
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.executor import LaunchedStep, RunWhenSampled
from officellm.engine.worker.model_runner import BlocksOnHost, ModelRunner, StepBatch
from officellm.engine.worker.tp_worker import (
    SCRUB,
    SHUTDOWN,
    STEP,
    WorkerArgs,
    started_key,
    worker_main,
)
from officellm.engine.worker.worker import rank_device

logger = logging.getLogger("officellm.engine.worker.executor")

# Seconds a worker gets to leave after the shutdown message, then after SIGTERM.
JOIN_TIMEOUT = 5.0


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker is gone, or the group fell out of step: the engine cannot
    run another step and must be restarted."""


@dataclass
class _Workers:
    """What stopping the workers needs; held apart from the executor so that a finalizer
    (garbage collection, interpreter exit) can stop them without keeping it alive."""

    procs: list[BaseProcess] = field(default_factory=list)
    pipes: list[Connection] = field(default_factory=list)
    parallel: ParallelState | None = None
    in_loop: bool = False  # start-up is over: the workers wait for step messages


class MultiprocExecutor:
    """Starts ranks 1..tp-1 and joins the group as rank 0 (blocks until all have joined)."""

    def __init__(self, config: EngineConfig, model_dir: Path) -> None:
        tp = config.tensor_parallel_size
        ctx = mp.get_context("spawn")
        store = rendezvous_store(tp)
        self.broken: str | None = None
        self.runner: ModelRunner | None = None  # rank 0's, once start-up is over
        self._workers = workers = _Workers()
        # Set up before the first start: whatever fails below, the workers get stopped.
        self._finalizer = weakref.finalize(self, _stop_workers, workers)
        try:
            self.parallel = self._start(config, model_dir, ctx, store)
        except BaseException:
            self.close()
            raise
        workers.parallel = self.parallel

    def _start(self, config: EngineConfig, model_dir: Path, ctx: Any,
               store: dist.TCPStore) -> ParallelState:
        tp = config.tensor_parallel_size
        workers = self._workers
        for rank in range(1, tp):
            ours, theirs = ctx.Pipe()
            args = WorkerArgs(config, Path(model_dir), rank, tp, store.port,
                              logging.getLogger("engine").getEffectiveLevel())
            proc = ctx.Process(target=worker_main, args=(args, theirs),
                               name=f"officellm-tp-rank{rank}", daemon=True)
            proc.start()
            theirs.close()  # only the worker holds its end: our exit is its end-of-file
            workers.procs.append(proc)
            workers.pipes.append(ours)
        logger.info("Started %d tensor-parallel worker process(es): pids %s", tp - 1,
                    ", ".join(str(p.pid) for p in workers.procs))
        self._wait_started(store)
        return init_parallel_state(store, 0, tp, rank_device(config.device, 0))

    def _wait_started(self, store: dist.TCPStore) -> None:
        """Wait until every worker process is up, failing at once if one dies first (joining
        the group would otherwise wait its whole timeout for a rank that never comes)."""
        keys = [started_key(rank) for rank in range(1, len(self._workers.procs) + 1)]
        while not store.check(keys):
            dead = [p for p in self._workers.procs if not p.is_alive()]
            if dead:
                raise WorkerDiedError(
                    "Tensor-parallel worker failed to start: " + ", ".join(
                        f"{p.name} exited with code {p.exitcode}" for p in dead)
                    + " (see its error above; workers start with spawn, so a script that "
                    "builds the engine at import time needs `if __name__ == '__main__':`)")
            time.sleep(0.02)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._workers.procs if p.pid is not None]

    def started(self, runner: ModelRunner) -> None:
        """Start-up is over: rank 0 runs steps with `runner`; the workers wait for them."""
        self.runner = runner
        self._workers.in_loop = True

    def execute(self, so: SchedulerOutput, grammar: GrammarBitmask | None = None) -> SamplerOutput:
        """Tell every worker to run this step, then run it here (rank 0 samples, and
        applies the grammar masks: the workers never see them)."""
        assert self.runner is not None, "started() comes first"
        self.runner.sampler.release(so.finished_request_ids)
        batch, sampling = self.runner.batch_for(so)
        self.send_step(batch)
        try:
            return self.runner.execute_batch(batch, sampling, grammar)
        except Exception as exc:
            # The other ranks may be waiting in a collective this rank never reached.
            self.mark_broken(f"a step failed on rank 0: {exc}")
            raise

    def launch(self, so: SchedulerOutput) -> LaunchedStep:
        """The step, run whole when its sampling is asked for (the other ranks could not read
        a token left on rank 0's device, so tensor parallelism does not run ahead)."""
        return RunWhenSampled(partial(self.execute, so))

    def send_step(self, batch: StepBatch) -> None:
        """Tell every worker to run this step (rank 0 then runs it too)."""
        self._send((STEP, batch))

    def scrub(self, block_ids: list[int]) -> None:
        """Zero these KV blocks in every rank's shard of the pool."""
        if self.broken is None:  # else no worker runs another step: nothing to protect
            self._send((SCRUB, block_ids))
        if self.runner is not None:
            self.runner.scrub_blocks(block_ids)

    def read_blocks(self, block_ids: list[int]) -> BlocksOnHost:
        raise NotImplementedError(LOWER_TIER_NEEDS_ONE_RANK)

    def write_blocks(self, block_ids: list[int], payloads: list[memoryview],
                     wait: bool = False) -> None:
        raise NotImplementedError(LOWER_TIER_NEEDS_ONE_RANK)

    def mark_broken(self, reason: str) -> None:
        """A step failed part-way: the ranks may be out of step, so run no more (and stop
        the workers without a shutdown message, which they might take for something else)."""
        self.broken = reason
        self._workers.in_loop = False

    def _send(self, message: tuple) -> None:
        if self.broken is not None:
            raise WorkerDiedError(f"The tensor-parallel group is out of order ({self.broken}); "
                                  "restart the engine.")
        self._raise_if_dead()
        try:
            self.parallel.broadcast_object(message)
        except RuntimeError as exc:  # gloo: a worker is dying or died since the check above
            for proc in self._workers.procs:
                proc.join(JOIN_TIMEOUT)  # long enough to be reaped, if it is dying
            self._raise_if_dead()
            self.mark_broken(f"broadcast failed: {exc}")
            raise WorkerDiedError(f"Tensor-parallel broadcast failed: {exc}") from exc

    def _raise_if_dead(self) -> None:
        dead = [p for p in self._workers.procs if not p.is_alive()]
        if dead:
            self.mark_broken(", ".join(f"{p.name} exited with code {p.exitcode}" for p in dead))
            raise WorkerDiedError(f"Tensor-parallel worker gone: {self.broken}; restart the "
                                  "engine.")

    def close(self) -> None:
        """Stop every worker (idempotent); leave the process group."""
        self._finalizer()


def _stop_workers(workers: _Workers) -> None:
    """Ask politely (a shutdown message), then close the pipes (the workers' watchdogs exit),
    then SIGTERM, then SIGKILL: no worker outlives this call."""
    procs = workers.procs
    polite = workers.in_loop and workers.parallel is not None and all(p.is_alive() for p in procs)
    if polite:
        try:
            workers.parallel.broadcast_object((SHUTDOWN, None))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - a broken group: the steps below still stop them
            logger.warning("Could not send the shutdown message to the workers", exc_info=True)
            polite = False
    for proc in procs:
        proc.join(JOIN_TIMEOUT if polite else 0)
    for pipe in workers.pipes:
        pipe.close()
    for proc in procs:
        proc.join(JOIN_TIMEOUT)
        if proc.is_alive():
            proc.terminate()
            proc.join(JOIN_TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if procs:
        logger.info("Stopped %d tensor-parallel worker process(es): exit codes %s", len(procs),
                    ", ".join(str(p.exitcode) for p in procs))
    if workers.parallel is not None:
        workers.parallel.destroy()

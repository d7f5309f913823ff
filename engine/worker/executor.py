"""Executors: how the engine core runs a scheduled step on the model's ranks.

`UniprocExecutor` runs it in this process; `officellm.engine.worker.multiproc_executor`'s
`MultiprocExecutor` runs it on every tensor-parallel rank, this process being rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from officellm.engine.core.scheduler_output import SamplerOutput, SchedulerOutput
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.model_runner import BlocksOnHost, ModelRunner, QueuedForward


class StepResult(Protocol):
    """A sampled step's samples (engine/worker/pending_samples.py's PendingSamples)."""

    def result(self) -> SamplerOutput:
        """The samples on the host, once the device has them."""
        ...


class LaunchedStep(Protocol):
    """A step whose forward is queued; its sampling comes once the grammar masks are known."""

    def sample(self, grammar: GrammarBitmask | None) -> StepResult:
        """Queue the sampling (`grammar` masks the constrained rows); the samples unread."""
        ...


@dataclass(frozen=True)
class RanStep:
    """A step that has already run: its samples as they are."""

    output: SamplerOutput

    def result(self) -> SamplerOutput:
        return self.output


@dataclass(frozen=True)
class RunWhenSampled:
    """A step run whole, forward and sampling, when its sampling is asked for (an
    executor that cannot queue a forward alone)."""

    run: Callable[[GrammarBitmask | None], SamplerOutput]

    def sample(self, grammar: GrammarBitmask | None) -> StepResult:
        return RanStep(self.run(grammar))


class Executor(Protocol):
    """Runs steps on every rank of the model and keeps their KV caches in step."""

    def launch(self, so: SchedulerOutput) -> LaunchedStep:
        """Queue one step's forward (async scheduling reads the step before while it runs);
        its sampling, and rank 0's samples (a row per request that samples), follow."""
        ...

    def scrub(self, block_ids: list[int]) -> None:
        """Zero these KV blocks on every rank (a failed request may have written NaN)."""
        ...

    def read_blocks(self, block_ids: list[int]) -> BlocksOnHost:
        """Copy KV blocks to the host, after the work queued so far (a lower tier's save)."""
        ...

    def write_blocks(self, block_ids: list[int], payloads: list[memoryview],
                     wait: bool = False) -> None:
        """Copy KV blocks in from the host (a lower tier's) into pool blocks no step reads
        yet, from any thread (ModelRunner.write_blocks: `wait` for the device's copy)."""
        ...

    def close(self) -> None:
        """Stop whatever the executor started (idempotent)."""
        ...


@dataclass(frozen=True)
class QueuedOnRunner:
    """A forward queued by this process's ModelRunner."""

    runner: ModelRunner
    queued: QueuedForward

    def sample(self, grammar: GrammarBitmask | None) -> StepResult:
        pending = self.runner.sample(self.queued, grammar)
        return RanStep(SamplerOutput.empty()) if pending is None else pending


class UniprocExecutor:
    """The model on one rank, in this process."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def launch(self, so: SchedulerOutput) -> LaunchedStep:
        return QueuedOnRunner(self.runner, self.runner.launch(so))

    def scrub(self, block_ids: list[int]) -> None:
        self.runner.scrub_blocks(block_ids)

    def read_blocks(self, block_ids: list[int]) -> BlocksOnHost:
        return self.runner.read_blocks(block_ids)

    def write_blocks(self, block_ids: list[int], payloads: list[memoryview],
                     wait: bool = False) -> None:
        self.runner.write_blocks(block_ids, payloads, wait)

    def close(self) -> None:
        pass

"""Executors: how the engine core runs a scheduled step on the model's ranks.

`UniprocExecutor` runs it in this process; `officellm.engine.worker.multiproc_executor`'s
`MultiprocExecutor` runs it on every tensor-parallel rank, this process being rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from officellm.engine.core.scheduler_output import SamplerOutput, SchedulerOutput
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.model_runner import ModelRunner


class StepResult(Protocol):
    """A launched step's samples (engine/worker/pending_samples.py's PendingSamples)."""

    def result(self) -> SamplerOutput:
        """The samples on the host, once the device has them."""
        ...


@dataclass(frozen=True)
class RanStep:
    """A step that has already run: its samples as they are."""

    output: SamplerOutput

    def result(self) -> SamplerOutput:
        return self.output


class Executor(Protocol):
    """Runs steps on every rank of the model and keeps their KV caches in step."""

    def execute(self, so: SchedulerOutput, grammar: GrammarBitmask | None = None) -> SamplerOutput:
        """Run one step; rank 0's samples, a row per request that samples (`grammar`
        masks the constrained rows)."""
        ...

    def launch(self, so: SchedulerOutput,
               grammar: GrammarBitmask | None = None) -> StepResult:
        """Queue one step and return before its samples are read (async scheduling);
        executors that cannot run ahead return it already run."""
        ...

    def scrub(self, block_ids: list[int]) -> None:
        """Zero these KV blocks on every rank (a failed request may have written NaN)."""
        ...

    def close(self) -> None:
        """Stop whatever the executor started (idempotent)."""
        ...


class UniprocExecutor:
    """The model on one rank, in this process."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def execute(self, so: SchedulerOutput, grammar: GrammarBitmask | None = None) -> SamplerOutput:
        return self.runner.execute(so, grammar)

    def launch(self, so: SchedulerOutput,
               grammar: GrammarBitmask | None = None) -> StepResult:
        pending = self.runner.launch(so, grammar)
        return RanStep(SamplerOutput.empty()) if pending is None else pending

    def scrub(self, block_ids: list[int]) -> None:
        self.runner.scrub_blocks(block_ids)

    def close(self) -> None:
        pass



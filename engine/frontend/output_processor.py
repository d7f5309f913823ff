"""OutputProcessor: the engine core's tokens become what a client reads.

Detokenization, stop strings, the n-way fan-in of a request's sequences, its timing, and the
output itself (deltas while streaming, or the whole output once) happen here and only here,
for `LLM.generate` and for the server alike. It runs beside the core, not inside its step:
the server runs it on the event loop's thread while the core steps on its own.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.frontend.detokenizer import IncrementalDetokenizer
from officellm.engine.frontend.outputs import (
    CompletionOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)

logger = logging.getLogger("officellm.engine.frontend.output_processor")

OUTPUT_ERROR = "internal error while processing this request's output"


class OutputKind(enum.Enum):
    DELTA = "delta"  # every step's additions (streaming)
    FINAL = "final"  # the whole output, once, when the request has finished


@dataclass(eq=False)
class _Sequence:
    """One of a request's n sequences: its detokenizer and, for FINAL, what it produced."""

    core_id: str
    index: int
    detok: IncrementalDetokenizer
    min_tokens: int
    num_output_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None


@dataclass(eq=False)
class _Request:
    """A client's request: its n sequences reported under one id."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    kind: OutputKind
    seqs: list[_Sequence]
    metrics: RequestMetrics
    error: str | None = None
    # The first sequence's prompt logprobs to arrive (every sequence computes the same), and
    # whether a streamed request has yet to be sent them.
    prompt_logprobs: PromptLogprobs | None = None
    prompt_logprobs_due: bool = False

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)


@dataclass
class IterationStats:
    """One step's latencies, in seconds, per client request: time to first token for those
    whose first token came, the gap since the previous token for the others, and end to end
    for those that finished; and, with each first token, the time the request waited in the
    engine core's queue before it was first scheduled (measured by the core)."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)


@dataclass
class ProcessedOutputs:
    """One step's outputs per client request, the core requests to abort (ended by a stop
    string, or failed here: the core does not know yet), and the step's latencies."""

    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]
    stats: IterationStats


class OutputProcessor:
    """Per-request output state; owns the tokenizer it decodes with (one thread uses it)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, _Request] = {}
        self._seqs: dict[str, tuple[_Request, _Sequence]] = {}  # by core request id

    def add_request(self, request_id: str, prompt: str | None, core_requests: list[EngineCoreRequest],
                    kind: OutputKind = OutputKind.DELTA) -> None:
        """Track a request whose sequences are `core_requests` (same prompt and params)."""
        if request_id in self._requests or any(c.request_id in self._seqs for c in core_requests):
            raise ValueError(f"Request id {request_id!r} is already in use.")
        first = core_requests[0]
        p = first.params
        seqs = [_Sequence(c.request_id, i,
                          IncrementalDetokenizer(self.tokenizer, c.prompt_token_ids, p.stop,
                                                 p.skip_special_tokens,
                                                 p.include_stop_str_in_output),
                          p.min_tokens, logprobs=[] if p.logprobs is not None else None)
                for i, c in enumerate(core_requests)]
        req = _Request(request_id, prompt, first.prompt_token_ids, kind, seqs,
                       RequestMetrics(time.monotonic()))
        self._requests[request_id] = req
        for seq in seqs:
            self._seqs[seq.core_id] = (req, seq)

    def abort_request(self, request_id: str) -> list[str] | None:
        """Forget a request; the ids of its sequences the core may still run, or None if
        the request is unknown (finished, or never added)."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._forget(req)
        return [s.core_id for s in req.seqs if s.finish_reason is None]

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def process_outputs(self, outputs: Iterable[EngineCoreOutput]) -> ProcessedOutputs:
        """Turn one core step's outputs into RequestOutputs (one per client request that
        changed; FINAL requests only when they finish)."""
        now = time.monotonic()
        touched: dict[_Request, list[CompletionOutput]] = {}
        to_abort: list[str] = []
        stats = IterationStats()
        for out in outputs:
            found = self._seqs.get(out.request_id)
            if found is None:
                continue  # aborted while the core was stepping
            req, seq = found
            if req.error is not None:
                continue
            if out.new_token_ids and req not in touched:
                last = req.metrics.last_token_time
                if last is None:
                    stats.ttft.append(now - req.metrics.arrival_time)
                    if out.queue_time is not None:
                        stats.queue.append(out.queue_time)
                else:
                    stats.itl.append(now - last)
            try:
                delta = self._apply(req, seq, out, now, to_abort)
            except Exception:  # noqa: BLE001 - e.g. a tokenizer error fails this request only
                logger.exception("Processing the output of request %s failed", out.request_id)
                self._fail(req, OUTPUT_ERROR, to_abort)
                touched.setdefault(req, [])
                continue
            if out.error is not None:
                self._fail(req, out.error, to_abort)
            touched.setdefault(req, []).append(delta)
        results = []
        for req, deltas in touched.items():
            finished = req.finished
            if finished:
                req.metrics.finished_time = now
                stats.e2e.append(now - req.metrics.arrival_time)
                self._forget(req)
            if req.kind is OutputKind.DELTA or finished or req.error is not None:
                results.append(self._output(req, deltas, finished))
        return ProcessedOutputs(results, to_abort, stats)

    def _apply(self, req: _Request, seq: _Sequence, out: EngineCoreOutput, now: float,
               to_abort: list[str]) -> CompletionOutput:
        """One core output onto its sequence; the sequence's delta."""
        stop_str = None
        for token in out.new_token_ids:
            seq.num_output_tokens += 1
            hit = seq.detok.add_token(token, check_stop=seq.num_output_tokens >= seq.min_tokens)
            stop_str = stop_str or hit
        finish, stop_reason = out.finish_reason, out.stop_reason
        if stop_str is not None and finish in (None, "length"):
            if finish is None:
                to_abort.append(seq.core_id)  # the core would go on generating
            finish, stop_reason = "stop", stop_str
        text = seq.detok.take_delta(finished=finish is not None)
        seq.finish_reason, seq.stop_reason = finish, stop_reason
        seq.num_cached_tokens = out.num_cached_tokens
        if out.prompt_logprobs is not None and req.prompt_logprobs is None:
            req.prompt_logprobs, req.prompt_logprobs_due = out.prompt_logprobs, True
        if out.new_token_ids:
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
            req.metrics.last_token_time = now
        if req.kind is OutputKind.FINAL:
            seq.text.append(text)
            seq.token_ids.extend(out.new_token_ids)
            if seq.logprobs is not None and out.new_logprobs:
                seq.logprobs.extend(out.new_logprobs)
        return CompletionOutput(seq.index, text, out.new_token_ids, finish, stop_reason,
                                out.new_logprobs if seq.logprobs is not None else None,
                                seq.num_output_tokens)

    def _fail(self, req: _Request, message: str, to_abort: list[str]) -> None:
        """End every sequence of the request with an error; the core stops the rest."""
        req.error = message
        for seq in req.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = "error"
                to_abort.append(seq.core_id)

    def _forget(self, req: _Request) -> None:
        self._requests.pop(req.request_id, None)
        for seq in req.seqs:
            self._seqs.pop(seq.core_id, None)

    def _output(self, req: _Request, deltas: list[CompletionOutput], finished: bool) -> RequestOutput:
        if req.kind is OutputKind.FINAL:
            deltas = [CompletionOutput(s.index, "".join(s.text), s.token_ids, s.finish_reason,
                                       s.stop_reason, s.logprobs, s.num_output_tokens)
                      for s in req.seqs]
        prompt_logprobs = None
        if req.kind is OutputKind.FINAL or req.prompt_logprobs_due:
            prompt_logprobs, req.prompt_logprobs_due = req.prompt_logprobs, False
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, deltas, finished,
                             req.seqs[0].num_cached_tokens, req.metrics, req.error,
                             prompt_logprobs)

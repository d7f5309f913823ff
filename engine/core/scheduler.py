"""Iteration-level scheduling: decodes first, chunked prefill, FCFS admission, preemption;
and the update of every request from what its step produced."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefill_pacer import PrefillPacer
from engine.core.request import Request, RequestStatus
from engine.core.scheduler_output import EngineCoreOutput, ScheduledChunk, SchedulerOutput
from engine.sampler import SamplerOutput

logger = logging.getLogger("engine.scheduler")

NAN_ERROR = "the model produced invalid values (NaN) for this request"


class Scheduler:
    """Continuous batching under a per-step token budget and a cap on running sequences."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        pacer: PrefillPacer | None = None,
    ) -> None:
        self.kv = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.pacer = pacer
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Finished since the last schedule(): the runner drops their per-request state.
        self._finished_ids: set[str] = set()
        # Blocks a failed request left unused, whose (possibly NaN) contents must be zeroed.
        self.blocks_to_scrub: list[int] = []
        self.num_preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_finished_total = 0

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """End these requests (unknown or finished ids are ignored) and free their blocks."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                self._finish(req, status)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Remove a request from the queues and free its blocks. A request that failed has
        its blocks discarded from the prefix cache and queued for scrubbing."""
        request.status = status
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        del self.requests[request.request_id]
        self._finished_ids.add(request.request_id)
        self.num_finished_total += 1
        self.blocks_to_scrub += self.kv.free(request, discard=status is RequestStatus.FINISHED_ERROR)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch."""
        budget = self.max_num_batched_tokens
        chosen: dict[Request, int] = {}  # request -> new tokens, in batch order
        num_preempted = 0
        decodes = [r for r in self.running if len(r.all_token_ids) - r.num_computed_tokens == 1]
        prefills = [r for r in self.running if len(r.all_token_ids) - r.num_computed_tokens > 1]
        # While others decode, the pacer bounds this step's prompt tokens (their next word
        # waits for the whole step); alone, a prompt gets the whole budget.
        pacer = self.pacer if decodes else None
        prefill_used = 0

        def prefill_room(context: int) -> int:
            if pacer is None:
                return budget
            return pacer.prefill_cap(len(decodes), context) - prefill_used

        allocate = self.kv.allocate_slots
        for req in decodes + prefills:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            remaining = len(req.all_token_ids) - req.num_computed_tokens
            room = budget if remaining == 1 else prefill_room(req.num_computed_tokens)
            if room <= 0:
                continue
            num_new = min(remaining, budget, room)
            while not allocate(req, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                num_preempted += 1
                budget += chosen.pop(victim, 0)
                if victim is req:
                    num_new = 0
                    break
            if num_new:
                chosen[req] = num_new
                budget -= num_new
                if remaining > 1:
                    prefill_used += num_new

        # Admit new work only when nothing had to be preempted: otherwise we would take
        # blocks from the very requests we just paused.
        if not num_preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                hits, num_hit = self.kv.get_computed_blocks(req)
                room = prefill_room(num_hit)  # a cached history is context the chunk attends to
                if room <= 0:
                    break
                num_new = min(req.num_tokens - num_hit, budget, room)
                if not allocate(req, num_new, hits):
                    break
                self.waiting.popleft()
                self.kv.record_prefix_lookup(req.num_tokens, num_hit)
                req.num_computed_tokens = num_hit
                if not req.scheduled:
                    req.scheduled = True
                    req.num_cached_tokens = num_hit
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                chosen[req] = num_new
                budget -= num_new
                prefill_used += num_new

        chunks = tuple(
            ScheduledChunk(req, req.num_computed_tokens, n,
                           req.num_computed_tokens + n == len(req.all_token_ids))
            for req, n in chosen.items())
        finished, self._finished_ids = frozenset(self._finished_ids), set()
        return SchedulerOutput(chunks, finished, num_preempted)

    def _preempt(self, request: Request) -> None:
        """Pause by recompute: free its blocks and put it back at the head of the queue."""
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)
        pool = self.kv.pool
        logger.warning(
            "Preempted request %s by recompute: KV cache full (%d/%d blocks in use, %.1f%%); "
            "%d preemptions in total",
            request.request_id, pool.num_used_blocks, pool.num_blocks,
            100.0 * pool.usage(), self.num_preemptions_total,
        )

    # -- after the step ------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, sampled: SamplerOutput,
                           step_seconds: float) -> list[EngineCoreOutput]:
        """Advance every scheduled request by its chunk; append the sampled tokens, end the
        requests that reached EOS, a stop token, max_tokens or max_model_len (stop strings
        are text: the output processor's), fail the rows whose logits held NaN. Returns one
        output per request that sampled."""
        if self.pacer is not None:
            self.pacer.observe(so.num_decodes, so.num_prefill_tokens, step_seconds,
                               so.prefill_context)
        outputs: list[EngineCoreOutput] = []
        tokens, logprobs, invalid = sampled.token_ids, sampled.logprobs, sampled.invalid
        row = 0
        for chunk in so.chunks:
            req = chunk.request
            req.num_computed_tokens = chunk.start + chunk.num_new_tokens
            if not chunk.samples:
                continue
            i, row = row, row + 1
            if invalid[i]:
                self._finish(req, RequestStatus.FINISHED_ERROR)
                outputs.append(EngineCoreOutput(req.request_id, [], None, "error",
                                                num_cached_tokens=req.num_cached_tokens,
                                                error=NAN_ERROR))
                continue
            token = tokens[i]
            req.append_output_token(token)
            self.generation_tokens_total += 1
            if len(req.output_token_ids) == 1:
                self.prompt_tokens_total += len(req.prompt_token_ids)
            status = self._stop_status(req, token)
            if status is not None:
                self._finish(req, status)
            lp = logprobs[i]
            outputs.append(EngineCoreOutput(
                req.request_id, [token], None if lp is None else [lp],
                status.finish_reason if status is not None else None, req.stop_reason,
                req.num_cached_tokens))
        return outputs

    def fail_batch(self, so: SchedulerOutput, message: str) -> list[EngineCoreOutput]:
        """The step itself failed: end every request it ran, with `message`."""
        outputs = []
        for chunk in so.chunks:
            req = chunk.request
            if req.is_finished:
                continue
            self._finish(req, RequestStatus.FINISHED_ERROR)
            outputs.append(EngineCoreOutput(req.request_id, [], None, "error",
                                            num_cached_tokens=req.num_cached_tokens,
                                            error=message))
        return outputs

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        """How the token just appended ends the request, if it does (token rules only)."""
        p = req.params
        num_output = len(req.output_token_ids)
        long_enough = num_output >= p.min_tokens
        if long_enough and not p.ignore_eos and token in req.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if long_enough and token in p.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if (p.max_tokens is not None and num_output >= p.max_tokens) or \
                len(req.all_token_ids) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

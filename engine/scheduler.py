"""Iteration-level scheduling: decodes first, chunked prefill, FCFS admission, preemption."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from engine.kv_cache_manager import KVCacheManager
from engine.prefill_pacer import PrefillPacer
from engine.request import Request, RequestStatus

logger = logging.getLogger("engine.scheduler")


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last known token (and so samples the next)."""
        req = self.request
        return req.num_computed_tokens + self.num_new_tokens == req.num_tokens


@dataclass
class SchedulerOutput:
    """What one step runs, in batch order: decodes first, then prefill chunks."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_decodes(self) -> int:
        return sum(1 for s in self.scheduled if s.num_new_tokens == 1 and s.samples)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decodes

    @property
    def prefill_context(self) -> int:
        """Sum over this step's prompt tokens of the context each attends to (read before
        the step advances the requests): the attention share of the prefill's cost."""
        return sum(s.num_new_tokens * (s.request.num_computed_tokens + s.num_new_tokens // 2)
                   for s in self.scheduled if not (s.num_new_tokens == 1 and s.samples))


class Scheduler:
    """Continuous batching under a per-step token budget and a cap on running sequences."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        pacer: PrefillPacer | None = None,
    ) -> None:
        self.kv = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pacer = pacer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions_total = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch."""
        budget = self.max_num_batched_tokens
        chosen: dict[str, ScheduledRequest] = {}
        out = SchedulerOutput()

        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        # While others decode, the pacer bounds this step's prompt tokens (their next word
        # waits for the whole step); alone, a prompt gets the whole budget.
        pacer = self.pacer if decodes else None
        prefill_used = 0

        def prefill_room(context: int) -> int:
            if pacer is None:
                return budget
            return pacer.prefill_cap(len(decodes), context) - prefill_used

        for req in decodes + prefills:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            remaining = req.num_tokens - req.num_computed_tokens
            room = budget if remaining == 1 else prefill_room(req.num_computed_tokens)
            if room <= 0:
                continue
            num_new = min(remaining, budget, room)
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim.request_id in chosen:
                    budget += chosen.pop(victim.request_id).num_new_tokens
                if victim is req:
                    num_new = 0
                    break
            if num_new:
                chosen[req.request_id] = ScheduledRequest(req, num_new)
                budget -= num_new
                if remaining > 1:
                    prefill_used += num_new

        # Admit new work only when nothing had to be preempted: otherwise we would take
        # blocks from the very requests we just paused.
        if not out.preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                hits, num_hit = self.kv.get_computed_blocks(req)
                room = prefill_room(num_hit)  # a cached history is context the chunk attends to
                if room <= 0:
                    break
                num_new = min(req.num_tokens - num_hit, budget, room)
                if not self.kv.allocate_slots(req, num_new, hits):
                    break
                self.waiting.popleft()
                self.kv.record_prefix_lookup(req.num_tokens, num_hit)
                req.num_computed_tokens = num_hit
                if req.metrics.first_scheduled_time is None:
                    req.metrics.first_scheduled_time = time.monotonic()
                    req.num_cached_tokens = num_hit
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                chosen[req.request_id] = ScheduledRequest(req, num_new)
                budget -= num_new
                prefill_used += num_new

        out.scheduled = list(chosen.values())
        return out

    def _preempt(self, request: Request) -> None:
        """Pause by recompute: free its blocks and put it back at the head of the queue."""
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)
        pool = self.kv.pool
        logger.warning(
            "Preempted request %s by recompute: KV cache full (%d/%d blocks in use, %.1f%%); "
            "%d preemptions in total",
            request.request_id, pool.num_used_blocks, pool.num_blocks,
            100.0 * pool.usage(), self.num_preemptions_total,
        )

    def finish_request(self, request: Request, status: RequestStatus) -> list[int]:
        """Remove a request from the queues and free its blocks.

        A request that failed has its blocks discarded from the prefix cache; the ids of
        blocks now unused are returned so their (possibly NaN) contents can be scrubbed.
        """
        request.status = status
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        return self.kv.free(request, discard=status is RequestStatus.FINISHED_ERROR)

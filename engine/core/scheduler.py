"""Iteration-level scheduling: decodes first, chunked prefill, admission and preemption in
the scheduling policy's order (engine/core/scheduling_policy.py); and the update of every
request from what its step produced.

Background work (EngineCoreRequest.background: a front end's title, tags or follow-ups that
nobody waits to read) comes after everyone else's, under every policy: a step that gives
prompt work to any other request gives background requests nothing, neither prompt chunks
nor decodes, so a person's prompt runs as if alone (its first word is not delayed by a
task's prefill, nor its chunks paced for a task's decodes); a background request is the
first to give its blocks or its running slot to another request. Background requests go on
in every other step, beside the others' decodes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from officellm.engine.core.image_ranges import image_chunk
from officellm.engine.core.kv_cache_manager import GroupBlocks, KVCacheManager
from officellm.engine.core.logprob import Logprob
from officellm.engine.core.prefill_pacer import PrefillPacer
from officellm.engine.core.request import Request, RequestStatus
from officellm.engine.core.scheduler_output import (
    EngineCoreOutput,
    SamplerOutput,
    ScheduledChunk,
    SchedulerOutput,
)
from officellm.engine.core.scheduling_policy import SchedulingPolicy, make_policy
from officellm.engine.core.speculation import Speculation

logger = logging.getLogger("officellm.engine.scheduler")

NAN_ERROR = "the model produced invalid values (NaN) for this request"


@dataclass
class _Step:
    """What one schedule() works with as it fills the step."""

    budget: int  # tokens left in the step
    decodes: list[Request]
    order: list[Request]  # prompt work: running prompts and waiting requests, in turn
    # Background requests' decodes and prompt work, in the same forms: for the rest of a step
    # in which no other request's prompt work was scheduled.
    background_decodes: list[Request]
    background_order: list[Request]
    long_prompts: set[Request]  # prompts longer than a step's budget (paced for others too)
    decodes_by_key: Counter[str]
    decode_context: float  # the decodes' mean context, for the pacer's cost model
    # Logits rows left for prompt logprobs: at most max_num_seqs a step, the rows start-up
    # profiling sizes the sampler for (engine/worker/memory_profiling.py), so a long prompt
    # owing them is chunked rather than holding a chunk-by-vocabulary tensor no profile
    # counted.
    logprob_rows: int
    chosen: dict[Request, int] = field(default_factory=dict)  # new tokens, in batch order
    drafts: dict[Request, tuple[int, ...]] = field(default_factory=dict)
    num_preempted: int = 0
    prefill_spent: float = 0.0  # the pacer's estimate of the step's prompt chunks so far
    first_words: Counter[str] = field(default_factory=Counter)  # keys of prompts it finishes


class Scheduler:
    """Continuous batching under a per-step token budget and a cap on running sequences;
    the scheduling policy decides whose prompt work comes first and whom to preempt."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        pacer: PrefillPacer | None = None,
        policy: SchedulingPolicy | str = "fcfs",
        speculation: Speculation | None = None,
        long_context_after: int | None = None,
    ) -> None:
        self.kv = kv_cache_manager
        # A request longer than this is computed in the model's long-context form, all of it
        # (LongRoPE: transformers recomputes a sequence's cache as it first grows past its
        # original window, and so do we; None: the model has one form).
        self.long_context_after = long_context_after
        self.speculation = speculation
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.pacer = pacer
        if pacer is not None:  # a prefix comes from the lower tier where reading is cheaper
            kv_cache_manager.prefill_seconds = lambda tokens: (
                pacer.chunk_cost(tokens) if pacer.costs() is not None else None)
        self.policy: SchedulingPolicy = (make_policy(policy, kv_cache_manager,
                                                     max_num_batched_tokens)
                                         if isinstance(policy, str) else policy)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Finished since the last schedule(): the runner drops their per-request state.
        self._finished_ids: set[str] = set()
        # Blocks a failed request left unused, whose (possibly NaN) contents must be zeroed.
        self.blocks_to_scrub: list[int] = []
        self.num_preemptions_total = 0
        self.preemptions_by_key: dict[str, int] = {}  # fairness key -> preemptions
        self.prompt_tokens_total = 0
        # Tokens run through the model as prompt work (not decodes): a prompt's tokens minus
        # its prefix hits, plus whatever preemption made it compute again.
        self.prompt_tokens_computed_total = 0
        self.generation_tokens_total = 0
        self.num_finished_total = 0

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        if self.long_context_after is not None and \
                request.num_tokens > self.long_context_after:
            request.long_context = True
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.policy.add(request)

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
        self.policy.remove(request)
        self._finished_ids.add(request.request_id)
        self.num_finished_total += 1
        self.blocks_to_scrub += self.kv.free(request, discard=status is RequestStatus.FINISHED_ERROR)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch: every running decode, then prompt work (running prompts'
        next chunks and new admissions) in the policy's order, under the token budget, the
        sequence cap, the prefill pacer and the blocks there are."""
        if self.long_context_after is not None:
            self._enter_long_context()
        step = self._start_step()
        self._schedule_decodes(step)
        if not self._schedule_prompts(step, step.order):
            # No one else's prompt work in this step: the background requests' turn.
            step.decodes += step.background_decodes
            self._schedule_decodes(step, step.background_decodes)
            self._schedule_prompts(step, step.background_order)
        self.policy.charge(step.chosen)
        return self._emit(step)

    def _start_step(self) -> _Step:
        """The running requests sorted into decodes and prompt work, and the order prompt
        work goes in; background requests apart."""
        decodes: list[Request] = []
        prefills: list[Request] = []
        for r in self.running:
            left = len(r.all_token_ids) + r.num_in_flight - r.num_computed_tokens
            if left > 1:
                prefills.append(r)
            # A request whose token in flight ends it by length is not run again (async
            # scheduling; without it nothing is in flight here).
            elif left == 1 and not (r.num_in_flight and self._ends_by_length(r)):
                decodes.append(r)
        # A long prompt goes after the others: it is chunked over many steps whatever comes
        # first, so a short prompt ahead of it costs it a few tokens; behind it, the short
        # prompt's user would wait for the whole paste (docs/design.md §9). And its chunk is
        # paced for the prompts the step finishes too: their users wait for their first word.
        order = self.policy.prefill_order(prefills, self.waiting)
        long_prompts = self._long_prompts(order)
        if long_prompts:
            order = [r for r in order if r not in long_prompts] + [
                r for r in order if r in long_prompts]
        foreground = [r for r in decodes if not r.background]
        return _Step(
            budget=self.max_num_batched_tokens, decodes=foreground,
            order=[r for r in order if not r.background],
            background_decodes=[r for r in decodes if r.background],
            background_order=[r for r in order if r.background],
            long_prompts=long_prompts,
            decodes_by_key=Counter(r.fairness_key for r in foreground),
            decode_context=(sum(r.num_computed_tokens for r in foreground) / len(foreground)
                            if foreground else 0.0),
            logprob_rows=self.max_num_seqs)

    def _schedule_decodes(self, step: _Step, decodes: list[Request] | None = None) -> None:
        """One token for each running decode of `decodes` (step.decodes by default; with its
        drafts, where speculation is worth it and free blocks allow), preempting the
        policy's victims for room."""
        spec = self.speculation
        for req in step.decodes if decodes is None else decodes:
            if step.budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            # Drafts follow the last token the host knows: none while one is in flight.
            draft = req.draft_token_ids if not req.num_in_flight else []
            # Drafts take free blocks only: a draft is never worth preempting anyone.
            if (draft and spec is not None and len(draft) < step.budget
                    and spec.worth_it(req, self.pacer, len(step.decodes), step.decode_context)
                    and self.kv.allocate_slots(req, 1 + len(draft))):
                step.drafts[req] = tuple(draft)
                num_new = 1 + len(draft)
            elif self._fit(step, req, 1):
                num_new = 1
            else:
                continue
            step.chosen[req] = num_new
            step.budget -= num_new

    def _schedule_prompts(self, step: _Step, order: list[Request]) -> bool:
        """Prompt work in `order`: running prompts' next chunks, and admissions while
        nothing had to be preempted. A key over its share cap gets a chunk only if no other
        key's prompt work was scheduled in this step, so the cap never idles it. Whether any
        prompt work was scheduled."""
        policy = self.policy
        prompt_keys: set[str] = set()
        admitting = True
        for req in order:
            if step.budget == 0:
                break
            if prompt_keys and policy.held_back(req) and prompt_keys != {req.fairness_key}:
                continue
            if req.owes_prompt_logprobs and not step.logprob_rows:
                continue  # not a request that does not fit: admission goes on after it
            if req.status is RequestStatus.RUNNING:
                room = self._prefill_room(step, req, req.num_computed_tokens)
                if room <= 0:
                    continue
                num_new = min(req.num_tokens_to_compute, step.budget, room)
                if req.images:  # an image's tokens run in one chunk
                    num_new = image_chunk(req.images, req.num_computed_tokens, num_new,
                                          min(req.num_tokens_to_compute, step.budget))
                    if not num_new:
                        continue
                num_new = self._fit(step, req, num_new)
            else:
                # Admit new work only while nothing had to be preempted: otherwise we would
                # take blocks from the very requests we just paused. The first request that
                # does not fit ends admission for this step (FCFS within the queue's order).
                # Requests whose prefix is being copied in count as running: each holds blocks.
                loading = self.kv.num_loading - self.kv.is_loading(req)
                if not admitting or step.num_preempted:
                    continue
                if req.num_in_flight:  # preempted with a token in flight: resumed once read
                    continue
                # Every running slot taken: a background request gives its own up.
                if len(self.running) + loading >= self.max_num_seqs and not (
                        self._make_slot(step, req)
                        and len(self.running) + loading < self.max_num_seqs):
                    continue
                num_new = self._admit(step, req)
                if not num_new:
                    # A prefix being read from the lower tier holds back its own request
                    # only; one that does not fit ends admission.
                    admitting = self.kv.is_loading(req)
                    continue
            if num_new:
                step.chosen[req] = num_new
                step.budget -= num_new
                if self.pacer is not None:
                    step.prefill_spent += self.pacer.chunk_cost(num_new, req.num_computed_tokens)
                if num_new == req.num_tokens_to_compute:
                    step.first_words[req.fairness_key] += 1
                if req.owes_prompt_logprobs:
                    step.logprob_rows -= num_new
                prompt_keys.add(req.fairness_key)
        return bool(prompt_keys)

    def _emit(self, step: _Step) -> SchedulerOutput:
        """The step's chunks in batch order, each request advanced past its chunk."""
        # Plain decodes first, then decodes with drafts (their positions run as a chunk over
        # the cache), then prompt work: the runner's decode kernel takes the leading
        # one-token chunks.
        order_of = {req: 0 if req not in step.drafts else 1 for req in step.decodes}
        chunks = []
        for req, n in sorted(step.chosen.items(), key=lambda item: order_of.get(item[0], 2)):
            start = req.num_computed_tokens
            samples = req in step.drafts or start + n == len(req.all_token_ids) + req.num_in_flight
            chunk = ScheduledChunk(req, start, n, samples, step.drafts.get(req, ()),
                                   req.prompt_logprob_positions(start, n))
            chunks.append(chunk)
            if not chunk.is_decode:
                self.prompt_tokens_computed_total += n
            # Advanced now, not when the results come back, so the next step can be scheduled
            # while this one runs (async scheduling); a chunk that samples puts a token in
            # flight.
            req.num_computed_tokens = start + n
            if samples:
                req.num_in_flight += 1
        finished, self._finished_ids = frozenset(self._finished_ids), set()
        return SchedulerOutput(tuple(chunks), finished, step.num_preempted, self.kv.take_saves())

    def _prefill_room(self, step: _Step, req: Request, context: int) -> int:
        """The prompt tokens `req` may take this step: while others decode, what the pacer
        allows (their next word waits for the whole step), else the whole budget; for a
        request that owes prompt logprobs, at most the logits rows left."""
        room = step.budget
        pacer = self.pacer
        if pacer is not None:
            waiters = (step.decodes_by_key + step.first_words if req in step.long_prompts
                       else step.decodes_by_key)
            pace = self.policy.prefill_pace(req.fairness_key, waiters, pacer.max_slowdown)
            if pace is not None:  # None: nobody waits on this step
                num_decodes, slowdown = pace
                room = pacer.prefill_cap(num_decodes, context, slowdown, step.prefill_spent,
                                         step.decode_context)
        return min(room, step.logprob_rows) if req.owes_prompt_logprobs else room

    def _fit(self, step: _Step, req: Request, num_new: int) -> int:
        """Allocate for a running request, preempting the policy's victims until it fits;
        the tokens it gets (0 if it was itself preempted)."""
        while not self.kv.allocate_slots(req, num_new):
            victim, why = self._background_victim(req) or self.policy.victim(self.running)
            self._preempt_for(step, victim, why)
            if victim is req:
                return 0
        return num_new

    def _make_room(self, step: _Step, req: Request, num_blocks: int) -> bool:
        """Preempt the policy's admission victim for a waiting request that needs
        `num_blocks` in all; False when the policy names none."""
        found = (self._background_victim(req)
                 or self.policy.admission_victim(req, num_blocks, self.running))
        if found is None:
            return False
        self._preempt_for(step, *found)
        return True

    def _make_slot(self, step: _Step, req: Request) -> bool:
        """Preempt a background request so that `req`, waiting while max_num_seqs run, can
        be admitted; False when none gives way."""
        found = self._background_victim(req)
        if found is None:
            return False
        self._preempt_for(step, *found, cause=f"all {self.max_num_seqs} running slots taken")
        return True

    def _background_victim(self, req: Request) -> tuple[Request, str] | None:
        """The most recently admitted running background request, to give way to `req`
        (not background itself); None when there is none."""
        if req.background:
            return None
        for victim in reversed(self.running):
            if victim.background:
                return victim, "it is background work (a front end's task) and another " \
                               "request needs room"
        return None

    def _preempt_for(self, step: _Step, victim: Request, why: str,
                     cause: str = "KV cache full") -> None:
        """Preempt `victim` in the middle of scheduling: its chunk, if chosen, goes back to
        the budget."""
        self._preempt(victim, why, cause)
        step.num_preempted += 1
        step.budget += step.chosen.pop(victim, 0)

    def _long_prompts(self, order: list[Request]) -> set[Request]:
        """The prompts in `order` with more tokens left to compute than a step's budget
        (a prefix cache hit is not work left). A preempted request is never one: its user is
        mid-answer, and it resumes in its place."""
        limit = self.max_num_batched_tokens
        found: set[Request] = set()
        for req in order:
            if req.status is RequestStatus.RUNNING:
                left = req.num_tokens_to_compute
            elif req.status is RequestStatus.WAITING and req.num_tokens > limit:
                left = req.num_tokens - (0 if req.owes_prompt_logprobs
                                         else self.kv.cached_prefix_tokens(req))
            else:
                continue
            if left > limit:
                found.add(req)
        return found

    def _admit(self, step: _Step, req: Request) -> int:
        """Admit a waiting request with its first chunk if the pacer's room and the blocks
        allow (the policy may preempt a heavier key's request to make the room); the chunk's
        tokens, or 0 (it stays waiting)."""
        hits, num_hit = self._cached_prefix(req)
        if self.kv.is_loading(req):
            return 0
        if self.kv.needs_load(hits):
            # Part of the prefix is below the pool: blocks are set aside for it and it is
            # copied in while the request waits (a copy from RAM is done at once).
            num_blocks = self.kv.num_blocks_after(req, 0, num_hit)
            while not self.kv.start_load(req, hits):
                if not self._make_room(step, req, num_blocks):
                    return 0
            if self.kv.is_loading(req):
                return 0
            hits, num_hit = self._cached_prefix(req)
        # A cached history is context the chunk attends to.
        room = self._prefill_room(step, req, num_hit)
        if room <= 0:
            return 0
        num_new = min(req.num_tokens - num_hit, step.budget, room)
        if req.images:  # an image's tokens run in one chunk
            num_new = image_chunk(req.images, num_hit, num_new,
                                  min(req.num_tokens - num_hit, step.budget))
            if not num_new:
                return 0
        num_blocks = self.kv.num_blocks_after(req, num_new, num_hit)
        while not self.kv.allocate_slots(req, num_new, hits):
            if not self._make_room(step, req, num_blocks):
                return 0
        if self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)
        self.kv.record_prefix_lookup(req, num_hit)
        req.num_computed_tokens = num_hit
        if not req.scheduled:
            req.scheduled = True
            req.num_cached_tokens = num_hit
            req.first_scheduled_time = time.monotonic()
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return num_new

    def _cached_prefix(self, req: Request) -> tuple[GroupBlocks, int]:
        """The request's prefix in the prefix cache (blocks per group, tokens), or none for a
        request that owes prompt logprobs: the cached positions' logits were never computed
        (vLLM's rule too). Its own blocks still go to the cache as they fill."""
        if req.owes_prompt_logprobs:
            return tuple([] for _ in self.kv.windows), 0
        return self.kv.get_computed_blocks(req)

    def _enter_long_context(self) -> None:
        """Running requests that have grown past long_context_after start over in the long
        form: their blocks go back (the short form's stay cached for others) and they are
        computed again from their first token, ahead of the queue."""
        limit = self.long_context_after
        assert limit is not None
        for req in [r for r in self.running if not r.long_context
                    and r.num_tokens + r.num_in_flight > limit]:
            self.running.remove(req)
            self._restart(req)
            req.long_context = True
            req.block_hashes = []  # hashed again under the long form's salt
            self.waiting.appendleft(req)
            logger.info("Request %s passed the model's original window of %d tokens: its KV "
                        "is computed again with the long-context rotary (as transformers does)",
                        req.request_id, limit)

    def _restart(self, request: Request) -> None:
        """Free its blocks and reset it to be computed again from its first token."""
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        if request.grammar is not None:
            request.grammar.sync(request.output_token_ids)

    def _preempt(self, request: Request, why: str, cause: str = "KV cache full") -> None:
        """Pause by recompute: free its blocks and put it back at the head of the queue."""
        pool = self.kv.pool
        used = pool.num_used_blocks  # before freeing: the state that forced the choice
        self.running.remove(request)
        self._restart(request)
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        key = request.fairness_key
        self.preemptions_by_key[key] = self.preemptions_by_key.get(key, 0) + 1
        self.waiting.appendleft(request)
        logger.warning(
            "Preempted request %s of key %r by recompute: %s (%d/%d blocks in use, "
            "%.1f%%); chosen because %s (%s policy); %d preemptions in total",
            request.request_id, key, cause, used, pool.num_blocks,
            100.0 * used / pool.num_blocks if pool.num_blocks else 0.0, why, self.policy.name,
            self.num_preemptions_total,
        )

    # -- after the step ------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, sampled: SamplerOutput,
                           step_seconds: float) -> list[EngineCoreOutput]:
        """Advance every scheduled request by its chunk; append the sampled tokens, end the
        requests that reached EOS, a stop token, max_tokens or max_model_len (stop strings
        are text: the output processor's), fail the rows whose logits held NaN. Returns one
        output per request that sampled."""
        if self.pacer is not None:
            self.pacer.observe(so.num_decode_rows, so.num_prefill_tokens, step_seconds,
                               so.prefill_context, so.decode_context, so.chunk_context)
        outputs: list[EngineCoreOutput] = []
        tokens, logprobs, invalid = sampled.token_ids, sampled.logprobs, sampled.invalid
        prompt_entries = iter(sampled.prompt_logprobs)
        row = 0
        for chunk in so.chunks:
            req = chunk.request
            if chunk.prompt_logprob_positions:
                self._add_prompt_logprobs(req, chunk.prompt_logprob_positions,
                                          next(prompt_entries))
            if not chunk.samples:
                continue
            req.num_in_flight -= 1
            # Ended while this step ran (async scheduling): a wasted row. (The status is
            # asked only of a request not running: this loop runs for every row.)
            if req.status is not RequestStatus.RUNNING and req.is_finished:
                row += 1 + len(chunk.draft)
                continue
            if chunk.draft:
                rows = len(chunk.draft) + 1
                outputs.append(self._verify(chunk, tokens[row:row + rows],
                                            logprobs[row:row + rows], invalid[row:row + rows]))
                row += rows
                continue
            i, row = row, row + 1
            if invalid[i]:
                self._finish(req, RequestStatus.FINISHED_ERROR)
                outputs.append(EngineCoreOutput(req.request_id, [], None, "error",
                                                num_cached_tokens=req.num_cached_tokens,
                                                error=NAN_ERROR))
                continue
            token = tokens[i]
            if req.grammar is not None and not req.grammar.accept(token):
                outputs.append(self._grammar_dead_end(req, token))
                continue
            req.append_output_token(token)
            self.generation_tokens_total += 1
            queue_time = None
            if len(req.output_token_ids) == 1:
                self.prompt_tokens_total += len(req.prompt_token_ids)
                queue_time = req.queue_time  # measured here, reported once: the first output
            status = self._stop_status(req, token)
            if status is not None:
                self._finish(req, status)
            lp = logprobs[i]
            outputs.append(EngineCoreOutput(
                req.request_id, [token], None if lp is None else [lp],
                status.finish_reason if status is not None else None, req.stop_reason,
                req.num_cached_tokens, queue_time=queue_time,
                prompt_logprobs=self._take_prompt_logprobs(req)))
        if self.speculation is not None:
            for req in self.running:  # the drafts each next decode verifies
                if req.num_tokens_to_compute == 1:
                    self.speculation.propose(req)
        return outputs

    def _verify(self, chunk: ScheduledChunk, tokens: list[int], logprobs: list,
                invalid: list[bool]) -> EngineCoreOutput:
        """A decode with drafts: the model's token at each position, kept up to and
        including the first that differs from the draft it follows (the drafts before it
        were what the model would have chosen, so their KV stays; the rest is rolled back:
        the next step writes over it). The stop rules apply to each kept token in turn."""
        req, draft = chunk.request, chunk.draft
        if any(invalid):
            self._finish(req, RequestStatus.FINISHED_ERROR)
            return EngineCoreOutput(req.request_id, [], None, "error",
                                    num_cached_tokens=req.num_cached_tokens, error=NAN_ERROR)
        kept: list[int] = []
        status = None
        queue_time = None
        for i, token in enumerate(tokens):
            req.append_output_token(token)
            kept.append(token)
            self.generation_tokens_total += 1
            if len(req.output_token_ids) == 1:
                self.prompt_tokens_total += len(req.prompt_token_ids)
                queue_time = req.queue_time
            status = self._stop_status(req, token)
            if status is not None or i == len(draft) or token != draft[i]:
                break
        accepted = sum(1 for a, b in zip(kept, draft, strict=False) if a == b)
        accepted = min(accepted, len(kept) - 1) if status is None else accepted
        # The KV of the last known token and of the kept drafts is the sequence's now.
        req.num_computed_tokens = chunk.start + len(kept)
        assert self.speculation is not None
        self.speculation.verified(req, len(draft), accepted)
        if status is not None:
            self._finish(req, status)
        lps = None if logprobs[0] is None else list(logprobs[:len(kept)])
        return EngineCoreOutput(req.request_id, kept, lps,
                                status.finish_reason if status is not None else None,
                                req.stop_reason, req.num_cached_tokens, queue_time=queue_time,
                                prompt_logprobs=self._take_prompt_logprobs(req))

    @staticmethod
    def _add_prompt_logprobs(req: Request, positions: range,
                             entries: list[dict[int, Logprob]]) -> None:
        """Keep a chunk's prompt logprobs. Positions computed twice (the request was
        preempted and recomputed while a step holding them was in flight) are kept once."""
        if req.is_finished or not req.owes_prompt_logprobs:
            return
        have = len(req.prompt_logprobs)
        if positions.start > have:  # never: each chunk starts where the last one's entries end
            logger.error("Request %s: prompt logprobs for positions %d.. arrived before those "
                         "from %d; dropped", req.request_id, positions.start, have)
            return
        req.prompt_logprobs.extend(entries[have - positions.start:])

    @staticmethod
    def _take_prompt_logprobs(req: Request) -> list[dict[int, Logprob] | None] | None:
        """The prompt logprobs owed, with None for the first prompt token, once: they go
        out with the request's first sampled token, and a recompute never sends them again."""
        if not req.owes_prompt_logprobs:
            return None
        req.prompt_logprobs_sent = True
        entries, req.prompt_logprobs = req.prompt_logprobs, []
        return [None, *entries]

    def _grammar_dead_end(self, req: Request, token: int) -> EngineCoreOutput:
        """The grammar allowed no token at this step (the sampled one is then outside it):
        end the request as complete, as vLLM does, rather than emit text that breaks it."""
        logger.warning("Request %s: its structured-output grammar admits no token after %d "
                       "output tokens (sampled %d); ended with finish_reason 'stop'",
                       req.request_id, req.num_output_tokens, token)
        self._finish(req, RequestStatus.FINISHED_STOPPED)
        return EngineCoreOutput(req.request_id, [], None, "stop",
                                num_cached_tokens=req.num_cached_tokens)

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

    def _ends_by_length(self, req: Request) -> bool:
        """Whether the tokens in flight already end the request by max_tokens or
        max_model_len (the rule in _stop_status, counted ahead)."""
        ahead = req.num_in_flight
        max_tokens = req.params.max_tokens
        return (max_tokens is not None and len(req.output_token_ids) + ahead >= max_tokens) or \
            len(req.all_token_ids) + ahead >= self.max_model_len

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
        if req.grammar is not None and req.grammar.is_terminated:
            return RequestStatus.FINISHED_STOPPED  # the grammar is complete: nothing may follow
        if (p.max_tokens is not None and num_output >= p.max_tokens) or \
                len(req.all_token_ids) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

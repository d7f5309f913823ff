"""Admission: whether a generation request may run now, decided once and released once.

`AdmissionControl` (one per app) keeps one counter per concept:
  draining    set at shutdown: new requests get 503, the drain waits for `in_flight`
  in_flight   generation requests admitted and not yet ended (officellm:requests_in_flight)
  sequences   engine sequences admitted (prompts x n) per model, each model against its own
              --max-num-seqs running plus --max-waiting-requests queued: beyond that 429 at
              once, not an unbounded wait (a busy model never refuses another's requests)
  per user    running requests per user (ConcurrencyLimiter), against the policy's
              max_concurrent_requests
and checks the user's daily quota. The scheduling tags count the user's recent work on the
other models (app/policy/cross_model.py). `admit()` is an async context manager: what it
takes is given back in exactly one place, `Admission._release`, when the block exits, or,
for a response handed over with `hold()` (a stream), when that response has been sent,
however it ends (finished, client gone, error, shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from officellm.app.accounts.accounts import Accounts
from officellm.app.admission.concurrency import ConcurrencyLimiter
from officellm.app.admission.decision_error import decision_error
from officellm.app.db import get_effective_policy
from officellm.app.errors import APIError, unavailable
from officellm.app.observability.refusals import Refusals
from officellm.app.policy import EffectivePolicy, SchedulingTags, check_daily_quota, scheduling_tags
from officellm.app.policy.cross_model import CrossModelService, cross_model_tags
from officellm.app.principal import Principal

logger = logging.getLogger("officellm.server")


@dataclass(eq=False)
class Admission:
    """One admitted request: its user, the policy read at admission, what it holds, and the
    engine's scheduling tags for it (the user's key, priority weight and KV share cap, from
    that same policy: a change applies from the next request)."""

    control: AdmissionControl
    principal: Principal
    policy: EffectivePolicy
    endpoint: str
    sequences: int
    scheduling: SchedulingTags
    model: str = ""  # the registry name its sequences count against ("": unnamed default)
    _held_by_response: bool = field(default=False, repr=False)
    _released: bool = field(default=False, repr=False)
    _on_release: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call `callback` when this admission is released (a model's lease ends with it)."""
        self._on_release.append(callback)

    def hold(self, response: Response) -> Response:
        """Keep this admission until `response` has been sent (a stream outlives its
        route); the route's `async with` then leaves it alone."""
        self._held_by_response = True
        return _HeldResponse(response, self)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self.control._leave(self)
        for callback in self._on_release:
            callback()


class _HeldResponse(Response):
    """Sends `inner`, then releases the admission, whatever way the sending ends."""

    def __init__(self, inner: Response, admission: Admission) -> None:
        self.inner = inner
        self.admission = admission
        self.status_code = inner.status_code
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.admission._release()


class AdmissionControl:
    """Admits generation requests: the shutdown drain, the queue bound, per-user concurrency
    and the daily quota. Lives on the event loop (the counters need no lock but the
    per-user one, which worker threads may also read)."""

    def __init__(self, accounts: Accounts, refusals: Refusals, max_running: int,
                 max_waiting: int, retry_after_s: int, share_across_models: bool = True) -> None:
        """`share_across_models`: lower a user's weight on one model by their recent work
        on the others (the fair policy's; under `priority` a weight is a rank, kept as set)."""
        self.accounts = accounts
        self.refusals = refusals
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self.concurrency = ConcurrencyLimiter()
        self.draining = False
        self.in_flight = 0
        self.last_active = time.monotonic()  # the last admission or release (idle sleep)
        self.sequences: dict[str, int] = {}  # admitted engine sequences, per model
        self.cross_model = CrossModelService()  # each user's recent tokens per model
        self.share_across_models = share_across_models
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def admit(self, principal: Principal, endpoint: str, sequences: int,
                    model: str | None = None) -> AsyncIterator[Admission]:
        """Admit one request of `sequences` engine sequences for `model` (its registry
        name), or raise its APIError: 503 while draining, 403 for a model the user's policy
        does not allow, 429 over the daily quota, the user's concurrency or the queue."""
        admission = await self._enter(principal, endpoint, sequences, model)
        try:
            yield admission
        finally:
            if not admission._held_by_response:
                admission._release()

    async def _enter(self, principal: Principal, endpoint: str, sequences: int,
                     model: str | None) -> Admission:
        self.refuse_if_draining()
        policy, used = await run_in_threadpool(self._policy_and_usage, principal.user_id)
        self.refuse_if_draining()  # the drain may have begun while the database answered
        if model is not None and policy.models is not None and model not in policy.models:
            self.refusals.server_limit(principal, "model_not_allowed")
            allowed = ", ".join(f"`{m}`" for m in policy.models) or "none"
            raise APIError(403, f"Your policy does not let you use the model `{model}`; you "
                                f"may use: {allowed}. Ask your administrator.",
                           param="model", code="model_not_allowed")
        decision = check_daily_quota(policy, used)
        if decision.action == "reject":
            self.refusals.policy(principal, decision, endpoint,
                                 {"tokens_today": used, "limit": policy.max_tokens_per_day})
            raise decision_error(decision)
        # Each check and its count happen in one synchronous step: a burst cannot slip past.
        decision = self.concurrency.try_acquire(principal.user_id, policy.max_concurrent_requests)
        if decision.action == "reject":
            self.refusals.policy(principal, decision, endpoint,
                                 {"limit": policy.max_concurrent_requests})
            raise decision_error(decision)
        key = model or ""
        if not self._fits(key, sequences):
            self.concurrency.release(principal.user_id)
            self.refusals.server_limit(principal, "queue_full")
            raise self._queue_full(model)
        self.sequences[key] = self.sequences.get(key, 0) + sequences
        self.in_flight += 1
        self.touch()
        self._idle.clear()
        return Admission(self, principal, policy, endpoint, sequences,
                         self._tags(principal.user_id, policy, key), key)

    def _tags(self, user_id: int, policy: EffectivePolicy, model: str) -> SchedulingTags:
        """The engine's tags for the user's request on `model`: the policy's, with the
        weight lowered by the user's recent work on the other models."""
        tags = scheduling_tags(user_id, policy)
        if not self.share_across_models:
            return tags
        return cross_model_tags(tags, self.cross_model.factor(user_id, model))

    def _fits(self, model: str, sequences: int) -> bool:
        """Whether `model`'s own bound (--max-num-seqs running plus --max-waiting-requests
        queued) holds `sequences` more. A model with nothing admitted takes any one request,
        however large, so a big `n` is never refused forever."""
        admitted = self.sequences.get(model, 0)
        return not admitted or admitted + sequences <= self.max_running + self.max_waiting

    def _leave(self, admission: Admission) -> None:
        self.concurrency.release(admission.principal.user_id)
        left = self.sequences.get(admission.model, 0) - admission.sequences
        if left > 0:
            self.sequences[admission.model] = left
        else:
            self.sequences.pop(admission.model, None)
        self.in_flight -= 1
        self.touch()
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    def _policy_and_usage(self, user_id: int) -> tuple[EffectivePolicy, int]:
        # Read per request, never cached: a policy the admin changed applies to the very
        # next request.
        with self.accounts.db.session() as session:
            policy = get_effective_policy(session, user_id)
        used = (self.accounts.writer.tokens_today(user_id)
                if policy.max_tokens_per_day is not None else 0)
        return policy, used

    def touch(self) -> None:
        """Count now as activity (the idle clock: app/models/idle_sleep.py)."""
        self.last_active = time.monotonic()

    def refuse_if_draining(self) -> None:
        """503 with Retry-After once shutdown has begun."""
        if self.draining:
            raise unavailable("The server is shutting down; retry on another instance or later.",
                              self.retry_after_s)

    def _queue_full(self, model: str | None) -> APIError:
        """429 with Retry-After: the model's waiting queue is full."""
        retry = self.retry_after_s
        what = f"The model `{model}`" if model else "The server"
        return APIError(429, f"{what} is at capacity ({self.max_running} requests running "
                             f"and {self.max_waiting} waiting); retry in {retry} s.",
                        code="server_overloaded", headers={"Retry-After": str(retry)})

    async def drain(self, timeout: float, abort_all: Callable[[], None]) -> bool:
        """Stop admitting; wait up to `timeout` s for the requests in flight, then call
        `abort_all` and give their handlers a moment to answer. True if all finished."""
        self.draining = True
        t0 = time.monotonic()
        if self.in_flight:
            logger.info("Shutting down: no new requests; waiting up to %.0f s for %d in flight",
                        timeout, self.in_flight)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            logger.warning("Shutdown timeout (%.0f s): aborting %d requests still in flight",
                           timeout, self.in_flight)
            abort_all()
            try:
                await asyncio.wait_for(self._idle.wait(), 5.0)
            except asyncio.TimeoutError:
                pass
            return False
        logger.info("In-flight requests finished in %.1f s", time.monotonic() - t0)
        return True

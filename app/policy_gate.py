"""The policy gate: what a generation request passes before the engine (app.policy docstring).

  admit()        the user's live policy, daily quota and concurrency -> 429 + Retry-After
  check_thread() (chat) evaluate() the thread limits -> reject (400) / notify / truncate

Every refusal is counted (officellm:policy_refusals_total{user,reason,action}) and recorded in
the events table; a truncation is recorded as an event too. Database reads run on a worker
thread, and nothing is cached, so a policy changed by the admin (API or CLI) applies to the
very next request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from app.accounts import Accounts
from app.auth import Principal
from app.chat_tokens import MeasuredPrompts
from app.db import get_effective_policy
from app.errors import APIError
from app.policy import (
    Decision,
    EffectivePolicy,
    check_daily_quota,
    count_turns,
    evaluate,
    thread_key,
)
from app.state import ServerState

Message = dict[str, Any]

# Which events-table kind each refusal is recorded as (docs/admin_api.md).
EVENT_KINDS = {"max_tokens_per_day": "quota", "max_concurrent_requests": "concurrency",
               "max_context_tokens": "policy_refusal", "max_turns": "policy_refusal"}
ERROR_CODES = {"max_tokens_per_day": "insufficient_quota",
               "max_concurrent_requests": "rate_limit_exceeded",
               "max_context_tokens": "context_cap_exceeded", "max_turns": "turn_limit_exceeded"}


@dataclass
class Ticket:
    """An admitted request: its user's policy as read at admission, its concurrency slot, and
    what is recorded when it ends. finish() is idempotent; every path must reach it."""

    accounts: Accounts
    principal: Principal
    policy: EffectivePolicy
    endpoint: str
    thread_key: str | None = None
    turns: int | None = None
    _done: bool = field(default=False, repr=False)

    def finish(self, prompt_tokens: int = 0, completion_tokens: int = 0,
               thread_completion_tokens: int | None = None) -> None:
        """Free the slot; record usage (and the thread) if the engine processed anything."""
        if self._done:
            return
        self._done = True
        self.accounts.limiter.release(self.principal.user_id)
        if prompt_tokens:
            self.accounts.record_request(self.principal.user_id, prompt_tokens, completion_tokens,
                                         self.thread_key, self.turns, thread_completion_tokens)


@dataclass
class ThreadPlan:
    """What the chat route runs: `prompt` is token ids when the check rendered them (the engine
    then need not), else None (render `messages` on the engine thread as usual)."""

    decision: Decision
    messages: list[Message]
    prompt: list[int] | None = None

    @property
    def truncated_turns(self) -> int:
        return self.decision.turns_dropped if self.decision.action == "truncate" else 0


def refuse(server: ServerState, principal: Principal, decision: Decision, endpoint: str,
           detail: dict[str, Any] | None = None) -> None:
    """Count and record a refusal (or a truncation) of `principal`'s request."""
    reason = decision.reason or "policy"
    server.metrics.record_policy_refusal(principal.user, reason, decision.action)
    kind = "truncation" if decision.action == "truncate" else EVENT_KINDS.get(reason, "policy_refusal")
    server.accounts.record_event(kind, principal.user_id, {
        "reason": reason, "action": decision.action, "endpoint": endpoint, **(detail or {})})


def _error(decision: Decision) -> APIError:
    headers = ({"Retry-After": str(decision.retry_after)} if decision.retry_after is not None
               else None)
    return APIError(decision.status, decision.message or "Refused by policy.",
                    param="messages" if decision.status == 400 else None,
                    code=ERROR_CODES.get(decision.reason or ""), headers=headers)


def _policy_and_usage(accounts: Accounts, user_id: int) -> tuple[EffectivePolicy, int]:
    with accounts.db.session() as session:
        policy = get_effective_policy(session, user_id)
    used = accounts.writer.tokens_today(user_id) if policy.max_tokens_per_day is not None else 0
    return policy, used


async def admit(server: ServerState, principal: Principal, endpoint: str) -> Ticket:
    """Read the live policy; 429 over the daily quota or the concurrency limit; else a Ticket
    holding a concurrency slot (finish() it when the response ends)."""
    accounts = server.accounts
    policy, used = await run_in_threadpool(_policy_and_usage, accounts, principal.user_id)
    decision = check_daily_quota(policy, used)
    if decision.action == "reject":
        refuse(server, principal, decision, endpoint,
               {"tokens_today": used, "limit": policy.max_tokens_per_day})
        raise _error(decision)
    decision = accounts.limiter.try_acquire(principal.user_id, policy.max_concurrent_requests)
    if decision.action == "reject":
        refuse(server, principal, decision, endpoint,
               {"limit": policy.max_concurrent_requests})
        raise _error(decision)
    return Ticket(accounts, principal, policy, endpoint)


def _evaluate(policy: EffectivePolicy, messages: list[Message],
              counter: MeasuredPrompts) -> tuple[Decision, list[int] | None]:
    decision = evaluate(policy, messages, counter)
    if decision.action == "truncate":
        assert decision.messages is not None
        return decision, counter.known(decision.messages)
    return decision, counter.known(messages)


async def check_thread(server: ServerState, ticket: Ticket, messages: list[Message],
                       add_generation_prompt: bool, template_kwargs: dict[str, Any],
                       explicit_thread: str | None) -> ThreadPlan:
    """The thread limits of a chat request. Raises the 400 of `reject`; returns the plan
    (allow, notify, or truncate with the messages kept). Sets the ticket's thread."""
    policy, principal = ticket.policy, ticket.principal
    ticket.thread_key = thread_key(principal.user_id, messages, explicit_thread)
    ticket.turns = count_turns(messages)
    if policy.max_context_tokens is None and policy.max_turns is None:
        return ThreadPlan(Decision("allow", turns=ticket.turns), messages)
    counter = MeasuredPrompts(server.chat_tokenizer, add_generation_prompt, template_kwargs)
    try:
        decision, ids = await run_in_threadpool(_evaluate, policy, messages, counter)
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    if decision.action == "allow":
        return ThreadPlan(decision, messages, ids)
    detail = {"thread_key": ticket.thread_key, "turns": decision.turns,
              "tokens": decision.prompt_tokens,
              "limit": (policy.max_context_tokens if decision.reason == "max_context_tokens"
                        else policy.max_turns)}
    if decision.action == "truncate":
        detail.update(turns_dropped=decision.turns_dropped,
                      tokens_after=decision.truncated_prompt_tokens)
    refuse(server, principal, decision, ticket.endpoint, detail)
    if decision.action == "reject":
        raise _error(decision)
    if decision.action == "truncate":
        assert decision.messages is not None
        return ThreadPlan(decision, decision.messages, ids)
    return ThreadPlan(decision, messages)

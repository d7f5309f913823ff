"""Counting refused requests: one place for the metrics and the events table."""

from __future__ import annotations

from typing import Any

from officellm.app.accounts.accounts import Accounts
from officellm.app.observability.metrics import ServerMetrics
from officellm.app.policy import Decision
from officellm.app.principal import Principal

# Which events-table kind each policy refusal is recorded as (docs/admin_api.md).
EVENT_KINDS = {"max_tokens_per_day": "quota", "max_concurrent_requests": "concurrency",
               "max_context_tokens": "policy_refusal", "max_turns": "policy_refusal"}


class Refusals:
    """Records why requests were refused: officellm:refusals_total{user,reason} for the
    server's own limits, officellm:policy_refusals_total{user,reason,action} plus an event
    for a user's policy (a truncation is recorded as one too)."""

    def __init__(self, metrics: ServerMetrics, accounts: Accounts) -> None:
        self._metrics = metrics
        self._accounts = accounts

    def server_limit(self, principal: Principal, reason: str) -> None:
        """A refusal by the server (queue full, context length, a bad request, an engine
        error): counted per user and reason."""
        self._metrics.record_refusal(principal.user, reason)

    def policy(self, principal: Principal, decision: Decision, endpoint: str,
               detail: dict[str, Any] | None = None) -> None:
        """A policy stopped (or truncated) `principal`'s request."""
        reason = decision.reason or "policy"
        self._metrics.record_policy_refusal(principal.user, reason, decision.action)
        kind = ("truncation" if decision.action == "truncate"
                else EVENT_KINDS.get(reason, "policy_refusal"))
        self._accounts.record_event(kind, principal.user_id, {
            "reason": reason, "action": decision.action, "endpoint": endpoint, **(detail or {})})

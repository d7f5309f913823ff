"""A policy's refusal (a Decision) as the client's error."""

from __future__ import annotations

from officellm.app.errors import APIError
from officellm.app.policy.types import Decision

# The OpenAI error code of each policy refusal (a Decision's reason).
POLICY_ERROR_CODES = {"max_tokens_per_day": "insufficient_quota",
                      "max_concurrent_requests": "rate_limit_exceeded",
                      "max_context_tokens": "context_cap_exceeded",
                      "max_turns": "turn_limit_exceeded"}


def decision_error(decision: Decision) -> APIError:
    """A policy's refusal as the client's error: its status, its sentence, Retry-After."""
    headers = ({"Retry-After": str(decision.retry_after)} if decision.retry_after is not None
               else None)
    return APIError(decision.status, decision.message or "Refused by policy.",
                    param="messages" if decision.status == 400 else None,
                    code=POLICY_ERROR_CODES.get(decision.reason or ""), headers=headers)

"""Policy enforcement, pure: thread identity, thread limits, rate limits (no database here).

The batched database writer is app.policy.writer.UsageWriter (imported from there, as it pulls
in the database layer).
"""

from app.policy.evaluate import count_turns, drop_turns, evaluate
from app.policy.limits import ConcurrencyLimiter, check_daily_quota, seconds_until_utc_midnight
from app.policy.messages import context_limit_message, turn_limit_message
from app.policy.thread_identity import prefix_cache_salt, thread_key
from app.policy.types import Decision, EffectivePolicy, ThreadState

__all__ = [
    "ConcurrencyLimiter",
    "Decision",
    "EffectivePolicy",
    "ThreadState",
    "check_daily_quota",
    "context_limit_message",
    "count_turns",
    "drop_turns",
    "evaluate",
    "prefix_cache_salt",
    "seconds_until_utc_midnight",
    "thread_key",
    "turn_limit_message",
]

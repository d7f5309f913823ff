"""Policy enforcement, pure: thread identity, thread limits, rate limits (no database here).

The batched database writer is app.policy.writer.UsageWriter (imported from there, as it pulls
in the database layer).

Wired in app/policy_gate.py (admit, check_thread) and app/routes/chat.py. The chat route, in
order (each refusal: count it in officellm:policy_refusals_total and record an event of kind
policy_refusal, quota or concurrency; a truncation is recorded as kind truncation):
  1. who = app.db.authenticate(session, bearer) -> 401 if None; writer.touch_key(who.key_id)
  2. policy = app.db.get_effective_policy(session, who.user_id)   (read per request: live)
  3. check_daily_quota(policy, writer.tokens_today(uid))            -> 429 + Retry-After
  4. limiter.try_acquire(uid, policy.max_concurrent_requests)       -> 429 + Retry-After;
     release() when the response (or the stream) ends
  5. d = evaluate(policy, messages, count_tokens): reject -> 400 d.message; notify -> an
     assistant reply d.message, finish_reason "stop"; truncate -> run d.messages, header
     X-OfficeLLM-Truncated: d.turns_dropped
  6. engine, with cache salt prefix_cache_salt(uid, policy.share_prefix_cache)
  7. writer.add_usage(uid, prompt, completion); writer.record_thread(uid,
     thread_key(uid, messages, x_thread_id or body.user), d.turns, prompt, completion)
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

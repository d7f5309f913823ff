"""Policy rules, pure: thread identity, thread limits, rate limits (no database, no state).

Where they are enforced: app/admission/admission.py (daily quota, concurrency: 429 with
Retry-After; the scheduling tags read with the policy), app/models/prompt.py (the thread
limits with their on_limit: reject, notify, truncate), app/serving/generation.py (the
prefix-cache salt; the scheduling tags handed to the engine). The request path is drawn in
docs/design.md.
"""

from officellm.app.policy.background_tasks import (
    background_task,
    background_task_policy,
    runs_behind_people,
    task_max_tokens,
)
from officellm.app.policy.evaluate import count_turns, drop_turns, evaluate
from officellm.app.policy.limits import (
    check_concurrency,
    check_daily_quota,
    seconds_until_utc_midnight,
)
from officellm.app.policy.messages import context_limit_message, turn_limit_message
from officellm.app.policy.scheduling import (
    PRIORITY_CHOICES,
    PRIORITY_WEIGHTS,
    SchedulingTags,
    by_user_name,
    scheduling_tags,
)
from officellm.app.policy.thread_identity import (
    ChatThread,
    chat_thread,
    prefix_cache_salt,
    thread_key,
)
from officellm.app.policy.types import Decision, EffectivePolicy, ThreadState

__all__ = [
    "PRIORITY_CHOICES",
    "PRIORITY_WEIGHTS",
    "ChatThread",
    "SchedulingTags",
    "background_task",
    "background_task_policy",
    "by_user_name",
    "chat_thread",
    "scheduling_tags",
    "Decision",
    "EffectivePolicy",
    "ThreadState",
    "check_concurrency",
    "check_daily_quota",
    "context_limit_message",
    "count_turns",
    "drop_turns",
    "evaluate",
    "prefix_cache_salt",
    "runs_behind_people",
    "seconds_until_utc_midnight",
    "task_max_tokens",
    "thread_key",
    "turn_limit_message",
]

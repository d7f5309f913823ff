"""The values policy enforcement works on: a resolved policy, a thread's state, a decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

OnLimit = Literal["reject", "notify", "truncate"]
Action = Literal["allow", "reject", "notify", "truncate"]


@dataclass(frozen=True)
class EffectivePolicy:
    """A user's policy after merging their override onto the default; None = no limit."""

    max_context_tokens: int | None = None
    max_turns: int | None = None
    on_limit: OnLimit = "reject"
    max_concurrent_requests: int | None = None
    max_tokens_per_day: int | None = None
    # Minutes of audio a day /v1/audio/* may read for the user (app/openai/routes/audio.py).
    audio_minutes_per_day: int | None = None
    share_prefix_cache: bool = False
    # The fair scheduler's tags (app/policy/scheduling.py): low | normal | high, and the share
    # of the KV pool above which the user's prompts wait while others have work (None: no cap).
    priority: str = "normal"
    max_kv_share: float | None = None
    # The registered models' names the user may use (None: every model). Stored and merged
    # here; admission refuses a request for another.
    models: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_context_tokens": self.max_context_tokens,
            "max_turns": self.max_turns,
            "on_limit": self.on_limit,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_tokens_per_day": self.max_tokens_per_day,
            "audio_minutes_per_day": self.audio_minutes_per_day,
            "share_prefix_cache": self.share_prefix_cache,
            "priority": self.priority,
            "max_kv_share": self.max_kv_share,
            "models": list(self.models) if self.models is not None else None,
        }


@dataclass(frozen=True)
class ThreadState:
    """What the store knows about a thread from its previous requests."""

    turns: int = 0
    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0

    @property
    def length(self) -> int:
        """docs/design.md §6: the latest prompt plus completion."""
        return self.last_prompt_tokens + self.last_completion_tokens


@dataclass(frozen=True)
class Decision:
    """What the chat route does with a request before (or instead of) running the engine.

    - allow: run it as is.
    - reject: answer `status` (400 for a thread limit, 429 for rate limits, with
      `retry_after` seconds) and `message` in OpenAI's error shape.
    - notify: do not run the engine; answer a normal assistant reply whose content is
      `message`, finish_reason "stop" (stream and not).
    - truncate: run the engine on `messages` instead, and send the header
      `X-OfficeLLM-Truncated: <turns_dropped>`.
    `reason` names the limit that fired (for metrics and the events table); `prompt_tokens` and
    `turns` are the request's as measured (before any truncation); `truncated_prompt_tokens`
    is the prompt's size after truncation, when a token limit was involved.
    """

    action: Action
    message: str | None = None
    status: int = 200
    reason: str | None = None
    messages: list[dict[str, Any]] | None = None
    turns_dropped: int = 0
    prompt_tokens: int | None = None
    turns: int | None = None
    truncated_prompt_tokens: int | None = None
    retry_after: int | None = None

    @property
    def allowed(self) -> bool:
        """True when the engine runs (allow or truncate)."""
        return self.action in ("allow", "truncate")

    @property
    def refused(self) -> bool:
        """True for a refusal that must be counted and recorded as an event."""
        return self.action in ("reject", "notify")

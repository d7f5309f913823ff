"""Thread limits (max_context_tokens, max_turns) checked before the engine runs.

Chat clients resend the whole conversation every turn (docs/design.md §6), so the request itself is
the thread's truth: its prompt tokens are the thread's length so far, its user messages its
turns. (Stored thread statistics are not consulted: a client that edits an earlier message
sends a shorter history on the same thread, and must be measured as such.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from officellm.app.policy.messages import context_limit_message, turn_limit_message
from officellm.app.policy.types import Decision, EffectivePolicy

Message = dict[str, Any]
TokenCounter = Callable[[list[Message]], int]

# Both names mean "the system prompt" (OpenAI renamed it for newer models); never dropped.
SYSTEM_ROLES = frozenset({"system", "developer"})


def count_turns(messages: list[Message]) -> int:
    """A conversation's turns: its user messages."""
    return sum(1 for m in messages if m.get("role") == "user")


def _user_positions(messages: list[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def drop_turns(messages: list[Message], k: int) -> list[Message]:
    """`messages` without its oldest `k` non-system turns.

    A turn is a user message and everything non-system after it up to the next user message
    (the assistant's reply, tool calls and results); anything non-system before the first user
    message belongs to the first turn. System messages stay where they are, and the latest user
    message and what follows it are never dropped: `k` is at most the user messages minus one.
    """
    if k <= 0:
        return list(messages)
    users = _user_positions(messages)
    if k > len(users) - 1:
        raise ValueError(f"cannot drop {k} turns of {len(users)}: the latest one stays")
    cut = users[k]
    return [m for i, m in enumerate(messages) if i >= cut or m.get("role") in SYSTEM_ROLES]


def evaluate(policy: EffectivePolicy, messages: list[Message],
             count_tokens: TokenCounter) -> Decision:
    """Check a chat request against its user's thread limits.

    `count_tokens` measures a message list as the engine will see it (e.g. the length of the
    chat template's token ids, with the generation prompt). It is only called when
    max_context_tokens is set, and at most about log2(turns) + 2 times when truncating.
    """
    turns = count_turns(messages)
    tokens = count_tokens(messages) if policy.max_context_tokens is not None else None
    over_tokens = (tokens is not None
                   and tokens > policy.max_context_tokens)  # type: ignore[operator]
    over_turns = policy.max_turns is not None and turns > policy.max_turns
    if not over_tokens and not over_turns:
        return Decision("allow", prompt_tokens=tokens, turns=turns)

    # The token cap is the one that protects the KV cache, so its sentence wins when both fire.
    if over_tokens:
        reason = "max_context_tokens"
        message = context_limit_message(tokens, policy.max_context_tokens)  # type: ignore[arg-type]
    else:
        reason = "max_turns"
        message = turn_limit_message(turns, policy.max_turns)  # type: ignore[arg-type]

    if policy.on_limit == "notify":
        return Decision("notify", message=message, reason=reason, prompt_tokens=tokens,
                        turns=turns)
    reject = Decision("reject", message=message, status=400, reason=reason,
                      prompt_tokens=tokens, turns=turns)
    if policy.on_limit != "truncate":
        return reject
    return _truncate(policy, messages, count_tokens, tokens, turns, reason) or reject


def _truncate(policy: EffectivePolicy, messages: list[Message], count_tokens: TokenCounter,
              tokens: int | None, turns: int, reason: str) -> Decision | None:
    """The decision keeping the most turns that fit, or None if even the latest alone does not."""
    droppable = max(turns - 1, 0)
    k = max(turns - policy.max_turns, 0) if policy.max_turns is not None else 0
    if k > droppable:
        return None
    new_tokens = None
    limit = policy.max_context_tokens
    if limit is not None:
        # Fewest drops that fit: tokens fall as turns are dropped, so binary-search the count.
        new_tokens = count_tokens(drop_turns(messages, k))
        if new_tokens > limit:
            hi_tokens = count_tokens(drop_turns(messages, droppable))
            if hi_tokens > limit:
                return None
            lo, hi = k, droppable  # lo does not fit, hi fits
            new_tokens = hi_tokens
            while hi - lo > 1:
                mid = (lo + hi) // 2
                mid_tokens = count_tokens(drop_turns(messages, mid))
                if mid_tokens <= limit:
                    hi, new_tokens = mid, mid_tokens
                else:
                    lo = mid
            k = hi
    return Decision("truncate", reason=reason, messages=drop_turns(messages, k), turns_dropped=k,
                    prompt_tokens=tokens, turns=turns, truncated_prompt_tokens=new_tokens)

"""Which thread a chat request belongs to (docs/design.md §6).

Clients resend the whole history, so a conversation is recognised by what never changes in it:
its opening (the system prompt(s), and anything else up to and including the first user
message), salted with the user so two people's identical chats stay two threads. A client may
name the thread itself: the `X-Thread-Id` header, else Open WebUI's `X-OpenWebUI-Chat-Id` (its
chat's id, so a thread is exactly one Open WebUI chat), else the request's `user` field (but
not on a front-end key, where `user` names the person: app/admission/forwarded_identity.py).
A front end's background task (a chat's title, tags: app/policy/background_tasks.py) belongs
to no thread. Either way only a hash is kept: message content and client-chosen ids never
reach the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from officellm.app.policy.background_tasks import background_task

Message = dict[str, Any]

THREAD_ID_HEADER = "x-thread-id"
CHAT_ID_HEADER = "x-openwebui-chat-id"  # Open WebUI's FORWARD_SESSION_INFO_HEADER_CHAT_ID

HASH_PREFIX = "h:"  # identified by the opening messages
EXPLICIT_PREFIX = "x:"  # named by the client
_DIGEST_CHARS = 40  # 160 bits: collisions between one user's threads are not a concern


def _content_text(content: Any) -> Any:
    # [{"type": "text", "text": "hi"}] and "hi" are the same message; clients differ in which
    # form they send, and some switch between turns.
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def opening_messages(messages: list[Message]) -> list[Message]:
    """The messages that identify a conversation: everything up to the first user message."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return messages[: i + 1]
    return list(messages)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:_DIGEST_CHARS]


def thread_key(user_id: int | None, messages: list[Message],
               explicit_id: str | None = None) -> str:
    """The thread key of a request: stable across the turns of one chat, distinct between users.

    `explicit_id` (the client's own id for the thread: `chat_thread` picks it) wins when
    non-empty.
    `user_id` None is the anonymous desk user of `--no-auth`.
    """
    who = "anon" if user_id is None else str(user_id)
    if explicit_id:
        return EXPLICIT_PREFIX + _digest("explicit", who, explicit_id)
    opening = [
        {"role": m.get("role"), "name": m.get("name"), "content": _content_text(m.get("content"))}
        for m in opening_messages(messages)
    ]
    canonical = json.dumps(opening, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return HASH_PREFIX + _digest("opening", who, canonical)


@dataclass(frozen=True)
class ChatThread:
    """The thread a chat request belongs to: `key`, or None for a front end's background
    task (`task` names it), which is usage only."""

    key: str | None
    task: str | None = None


def chat_thread(user_id: int | None, messages: list[Message], headers: Mapping[str, str],
                user_field: str | None) -> ChatThread:
    """The thread of a chat request, from its headers (lower-case names), its messages and its
    `user` field (pass None where `user` names a person rather than a thread)."""
    task = background_task(headers, messages)
    if task is not None:
        return ChatThread(None, task)
    explicit = (headers.get(THREAD_ID_HEADER) or headers.get(CHAT_ID_HEADER) or user_field
                or None)
    return ChatThread(thread_key(user_id, messages, explicit))


def prefix_cache_salt(user_id: int | None, share_prefix_cache: bool) -> str | None:
    """The salt the server gives the engine for a user's prompts (docs/design.md §6).

    None lets the user's prompts share cached blocks with everyone who also shares (a common
    system prompt is computed once); otherwise the user's blocks hash apart from all others', so
    nobody can time another user's cached prompts. Set by the server, never by the client.
    """
    if share_prefix_cache:
        return None
    return f"user:{'anon' if user_id is None else user_id}"

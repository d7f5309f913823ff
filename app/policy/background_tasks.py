"""Requests a front end makes on its own: not a turn of anyone's chat, only usage.

After each answer Open WebUI asks the model for the chat's title, its tags and follow-up
suggestions (open_webui/routers/tasks.py). Those requests carry the chat's id
(X-OpenWebUI-Chat-Id) like the chat's own turns, so, taken as turns, each would overwrite its
chat's length and turns with its own (one user message) and could be refused for the chat's
cap. Open WebUI keeps its task name in request metadata that it does not send (routers/
openai.py pops `metadata` from the body), so a task is recognised by either:
  - the `X-OpenWebUI-Task` header, which the admin adds to the connection's headers in Open
    WebUI as `{"X-OpenWebUI-Task": "{{TASK}}"}` (Open WebUI fills {{TASK}} with the task's
    name, e.g. "title_generation", and with "" on a person's own message); or
  - the shape of Open WebUI's default task prompts (open_webui/config.py, DEFAULT_*_PROMPT_
    TEMPLATE for titles, tags, follow-ups, search queries, image prompts): one user message
    that starts with "### Task:" and holds the chat in <chat_history>...</chat_history>.
A task is the person's usage (requests, tokens, the daily quota) and nothing else
(docs/design.md §6).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from officellm.app.policy.evaluate import SYSTEM_ROLES
from officellm.app.policy.types import EffectivePolicy

TASK_HEADER = "x-openwebui-task"
PROMPT_TASK = "task_prompt"  # the name of a task recognised by its prompt alone

_TASK_OPENING = "### Task:"
_HISTORY_OPEN, _HISTORY_CLOSE = "<chat_history>", "</chat_history>"

Message = dict[str, Any]


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def background_task(headers: Mapping[str, str], messages: list[Message]) -> str | None:
    """The name of the front end's background task this chat request is, or None for a
    person's own turn. `headers`: lower-case names (Starlette's Headers is such a mapping)."""
    named = (headers.get(TASK_HEADER) or "").strip()
    if named:
        return named[:64]
    rest = [m for m in messages if m.get("role") not in SYSTEM_ROLES]
    if len(rest) != 1 or rest[0].get("role") != "user":
        return None
    text = _text(rest[0].get("content"))
    if text is None:
        return None
    text = text.strip()
    if (text.startswith(_TASK_OPENING) and _HISTORY_OPEN in text
            and text.endswith(_HISTORY_CLOSE)):
        return PROMPT_TASK
    return None


def background_task_policy(policy: EffectivePolicy) -> EffectivePolicy:
    """The limits a background task's prompt is held to: not a turn, so no `max_turns`, and
    never a notice or a truncation (either would become the chat's title); the context cap
    still bounds its own prompt, as a refusal, since that is what protects the KV cache."""
    return replace(policy, max_turns=None, on_limit="reject")

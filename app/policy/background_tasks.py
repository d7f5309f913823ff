"""Requests a front end makes on its own: not a turn of anyone's chat, kept small and behind
people. The one rule for recognising them (docs/clients.md, "Open WebUI").

After each answer Open WebUI asks the model for the chat's title, its tags and follow-up
suggestions (open_webui/routers/tasks.py); before a web search or a knowledge lookup it asks
for search queries, and while a person types (if enabled) for an autocompletion. Those
requests carry the chat's id (X-OpenWebUI-Chat-Id) like the chat's own turns, so, taken as
turns, each would overwrite its chat's length and turns with its own (one user message) and
could be refused for the chat's cap. Open WebUI keeps its task name in request metadata that
it does not send (routers/openai.py pops `metadata` from the body), so a task is recognised by
either:
  - the `X-OpenWebUI-Task` header, which the admin adds to the connection's headers in Open
    WebUI as `{"X-OpenWebUI-Task": "{{TASK}}"}` (Open WebUI fills {{TASK}} with the task's
    name: title_generation, tags_generation, follow_up_generation, query_generation,
    image_prompt_generation, autocomplete_generation, emoji_generation, function_calling,
    moa_response_generation; and "" on a person's own message); or
  - the shape of Open WebUI's default task prompts (open_webui/config.py, DEFAULT_*_PROMPT_
    TEMPLATE), one user message (under any system prompt) that starts with "### Task:" and
    holds the chat in <chat_history>...</chat_history>:
      title, tags, follow-ups, search/retrieval queries, image prompt: the chat history ends
        the message;
      autocomplete: after it come `<type>...</type>`, `<text>...</text>` (what the person has
        typed so far) and "#### Output:".
    Open WebUI's RAG template also starts with "### Task:" but holds <context>, not a chat
    history: that is a person's question, and no task. Custom task templates (the admin's
    own) are recognised by the header only.
What a task is held to, in one place here:
  - its usage is the person's (requests, tokens, the daily quota) and nothing else: no
    thread, no turn cap, never a notice (docs/design.md §6), its tokens also counted apart
    (officellm:task_* in /metrics);
  - `--task-max-tokens` (default 256): its max_tokens when it sends none (Open WebUI's
    follow-ups and tags send none, and would otherwise run to the server's default of
    2,048; a smaller --default-max-tokens still applies), and the most an explicit
    max_tokens gets;
  - it runs in the background (engine: EngineCoreRequest.background) behind every person's
    own message, except the tasks a person's answer waits for (function_calling picks the
    tools for the answer being written; moa_response_generation is the answer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from officellm.app.policy.evaluate import SYSTEM_ROLES
from officellm.app.policy.types import EffectivePolicy

TASK_HEADER = "x-openwebui-task"
PROMPT_TASK = "task_prompt"  # the name of a task recognised by its prompt alone

_TASK_OPENING = "### Task:"
_HISTORY_OPEN, _HISTORY_CLOSE = "<chat_history>", "</chat_history>"
# What follows the chat history in Open WebUI's autocomplete prompt.
_AUTOCOMPLETE_TAIL = re.compile(r"<type>.*?</type>\s*<text>.*</text>\s*#### Output:", re.DOTALL)
AUTOCOMPLETE_TASK = "autocomplete_generation"
# Tasks a person's answer waits for: capped like any task, but not put behind people.
FOREGROUND_TASKS = frozenset({"function_calling", "moa_response_generation"})

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
    if not text.startswith(_TASK_OPENING) or _HISTORY_OPEN not in text:
        return None
    history_end = text.rfind(_HISTORY_CLOSE)
    if history_end < 0:
        return None
    tail = text[history_end + len(_HISTORY_CLOSE):].strip()
    if not tail:
        return PROMPT_TASK
    return AUTOCOMPLETE_TASK if _AUTOCOMPLETE_TAIL.fullmatch(tail) else None


def runs_behind_people(task: str) -> bool:
    """Whether the task `task` (background_task's name) runs in the background, behind
    every person's own message: all but those a person's answer waits for."""
    return task not in FOREGROUND_TASKS


def task_max_tokens(requested: int | None, cap: int | None,
                    default: int | None = None) -> int | None:
    """The max_tokens a task runs with: what it asks for, never above `cap`
    (--task-max-tokens; None: no cap of its own); when it asks for none, `cap` or the
    server's `default` for any request (--default-max-tokens), whichever is smaller (None:
    the server's default applies later, as to any request)."""
    if requested is not None:
        return requested if cap is None else min(requested, cap)
    if cap is None or default is None:
        return cap
    return min(cap, default)


def background_task_policy(policy: EffectivePolicy) -> EffectivePolicy:
    """The limits a background task's prompt is held to: not a turn, so no `max_turns`, and
    never a notice or a truncation (either would become the chat's title); the context cap
    still bounds its own prompt, as a refusal, since that is what protects the KV cache."""
    return replace(policy, max_turns=None, on_limit="reject")

"""What every chat-shaped request does once admitted, whichever API it came by
(/v1/chat/completions, /v1/responses): its thread, its prompt under every length rule, its
grammar, and its engine request. One path, so both APIs count, cap and meter alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from app.admission.admission import Admission
from app.chat.chat_formats import ChatPlan
from app.policy import chat_thread
from app.serving.generation import Generation, compile_grammar
from app.serving.prompt import ChatPrompt, Message
from app.serving.state import ServerState
from engine import SamplingParams

# How many of the oldest turns a thread policy's on_limit=truncate dropped.
TRUNCATED_HEADER = "X-OfficeLLM-Truncated"


@dataclass(frozen=True)
class ChatStart:
    """An admitted chat request under way: its prompt and its running generation, or (None)
    the notice its thread policy answers instead of the engine (on_limit=notify)."""

    prompt: ChatPrompt
    generation: Generation | None

    @property
    def headers(self) -> dict[str, str] | None:
        """The answer's extra headers: how many turns truncation dropped, if any."""
        turns = self.prompt.truncated_turns
        return {TRUNCATED_HEADER: str(turns)} if turns else None


async def start_chat(server: ServerState, request: Request, admission: Admission,
                     messages: list[Message], plan: ChatPlan, params: SamplingParams, *,
                     request_id: str, stream: bool, user: str | None,
                     add_generation_prompt: bool = True,
                     template_kwargs: dict[str, Any] | None = None) -> ChatStart:
    """Render and check the prompt of `messages` (as `plan` shapes them), compile the
    grammar, and start the engine on it. `user` is the request's `user` field.

    Raises APIError for a length rule's refusal (400) or an engine that cannot serve (503),
    and ClientGone if the client leaves while its grammar compiles (nothing ran then).
    """
    principal = admission.principal
    # The client's id for the thread (X-Thread-Id, Open WebUI's chat id, else `user` unless
    # it names a person), else the opening messages; a front end's background task (a
    # title, tags) belongs to none.
    thread = chat_thread(principal.user_id, messages, request.headers,
                         None if principal.front_end is not None else user)
    prompt = await server.prompts.chat(admission, messages, thread, add_generation_prompt,
                                       {**(template_kwargs or {}), **plan.template_kwargs},
                                       params.max_tokens)
    if prompt.decision.action == "notify":
        return ChatStart(prompt, None)  # the engine never runs: nothing to count
    assert prompt.token_ids is not None
    grammar = await compile_grammar(server, params, request)
    gen = Generation(server, request_id, [prompt.token_ids], params, admission, stream=stream,
                     thread_key=thread.key, turns=prompt.turns, grammar=grammar, kind=plan.kind)
    gen.start()
    return ChatStart(prompt, gen)

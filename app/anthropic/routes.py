"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API on the chat
pipeline, so Claude Code and Anthropic's SDKs are admitted, capped, metered and shared like any
chat (docs/clients.md, "Claude Code").

Authentication is the same key, sent as `x-api-key` (or `Authorization: Bearer`); the
`anthropic-version` and `anthropic-beta` headers and the `beta=true` query are accepted: the
answer's shapes do not depend on them. Errors are in Anthropic's shape on these paths
(app/errors.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.auth import get_caller, get_principal
from officellm.app.anthropic.answers import (
    CountTokensResponse,
    ErrorDetail,
    ErrorEvent,
    MessageObject,
    Ping,
    StreamEvent,
    Usage,
)
from officellm.app.anthropic.message_output import (
    MessageEventWriter,
    Stop,
    whole_message,
)
from officellm.app.anthropic.protocol import CountTokensRequest, MessagesRequest
from officellm.app.chat.chat_formats import ChatPlan
from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts
from officellm.app.errors import invalid_value
from officellm.app.models.prompt import ChatPrompt
from officellm.app.models.served_model import ServedModel
from officellm.app.openai.sse import SSEResponse, sse
from officellm.app.principal import Principal
from officellm.app.serving.generation import Choice, Generation, RequestFailed
from officellm.app.serving.generation_pipeline import (
    ChatInput,
    GenerationCall,
    load_images,
    run_generation,
)
from officellm.app.serving.heartbeats import with_heartbeats
from officellm.app.serving.state import ServerState, admitted_server
from officellm.engine import CompletionOutput, EngineDeadError

access_log = logging.getLogger("officellm.access")

_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorEvent, "description": "A client error, in Anthropic's shape"},
    "5XX": {"model": ErrorEvent, "description": "A server error, in Anthropic's shape"},
}
router = APIRouter(responses=_ERRORS)


def _read(model: ServedModel, body: CountTokensRequest | MessagesRequest
          ) -> tuple[ChatPlan, list[dict[str, Any]]]:
    """The plan and the template messages of a conversation as `model` reads them;
    APIError 400 for what cannot be served."""
    try:
        plan = model.chat_formats.plan(body.tool_request(), body.output_constraint())
    except ValueError as exc:
        raise invalid_value(exc) from exc
    try:
        messages = plan.messages(body.template_messages())
    except ValueError as exc:
        raise invalid_value(exc, "messages") from exc
    return plan, messages


@router.post("/v1/messages", response_model=MessageObject)
async def create_message(body: MessagesRequest, request: Request,
                         principal: Principal = Depends(get_principal),
                         server: ServerState = Depends(admitted_server)) -> Response:
    """Anthropic's Messages API, streaming or not: the chat route's admission, prompt,
    length rules, tools, output constraint and engine, answered as a message (or its events)."""

    def read(model: ServedModel) -> ChatInput:
        plan, messages = _read(model, body)
        try:
            params = body.sampling_params(plan.constraint.spec if plan.constraint else None)
        except ValueError as exc:
            raise invalid_value(exc) from exc
        assert model.loaded is not None  # run_generation loaded it
        return ChatInput(messages, plan, params, model.name, model.loaded.max_model_len)

    kwargs = body.template_kwargs()
    call = GenerationCall("messages", f"msg_{uuid.uuid4().hex}", body.user, body.stream, body.model,
                    add_generation_prompt=not body.continues_answer, template_kwargs=kwargs)
    return await run_generation(server, request, principal, call, read,
                                lambda chat: _MessageAnswer(body, chat, chat.max_model_len))


@router.post("/v1/messages/count_tokens", response_model=CountTokensResponse)
async def count_tokens(body: CountTokensRequest, request: Request,
                       principal: Principal = Depends(get_principal),
                       server: ServerState = Depends(admitted_server)) -> CountTokensResponse:
    """The prompt tokens /v1/messages would send the engine for this conversation (before
    any truncation its user's thread policy applies). Like /tokenize, no admission: it is a
    tokenizer call on a worker thread, spending no quota."""
    t0 = time.monotonic()
    principal = await get_caller(request, principal, None)
    async with server.models.using(body.model) as model:
        plan, messages = _read(model, body)
        messages, images = await load_images(server, model, principal, messages)
        try:
            ids, _ = await run_in_threadpool(model.prompts.renderer.render_chat, messages,
                                             not body.continues_answer,
                                             {**body.template_kwargs(), **plan.template_kwargs},
                                             images)
        except ValueError as exc:
            raise invalid_value(exc, "messages") from exc
    # Never the text: only its size, like a generation's access line.
    access_log.info("count_tokens user=%s status=200 tokens=%d duration=%.3fs",
                    principal.user, len(ids), time.monotonic() - t0)
    return CountTokensResponse(input_tokens=len(ids))


@dataclass(frozen=True)
class _MessageAnswer:
    """A message, its events, or a policy's notice as the answer."""

    body: MessagesRequest
    chat: ChatInput
    max_model_len: int  # a generation that reached it stopped at the window

    def _message(self, message_id: str, usage: Usage) -> MessageObject:
        return MessageObject(id=message_id, model=self.chat.model, content=[], usage=usage)

    def notice(self, prompt: ChatPrompt) -> Response:
        """on_limit=notify: a normal answer carrying the policy's sentence, so clients that
        hide errors still show it. No engine call, so no tokens are used."""
        text = prompt.decision.message or ""
        usage = Usage(input_tokens=0, output_tokens=0)
        message = self._message(f"msg_{uuid.uuid4().hex}", usage)
        stop = Stop("end_turn")
        if not self.body.stream:
            parts = ChatMessageParts(text, None, [])
            return JSONResponse(whole_message(message, parts, stop, True).model_dump())

        async def events() -> AsyncIterator[str]:
            writer = MessageEventWriter(message, show_thinking=True)
            yield _events([*writer.start(usage), *writer.feed(ChatDeltaParts(content=text)),
                           *writer.finish(stop, usage)])
        return SSEResponse(events(), on_close=lambda: None)

    def stream(self, gen: Generation, headers: dict[str, str] | None) -> Response:
        message = self._message(gen.request_id, _usage(gen))
        return SSEResponse(_stream(gen, self, message), on_close=gen.close, headers=headers)

    def whole(self, gen: Generation, choices: list[Choice],
              headers: dict[str, str] | None) -> Response:
        output = choices[0].output
        parts = self.chat.plan.reader.message(output.text)
        stop = self.stop(gen, output, bool(parts.tool_calls))
        message = whole_message(self._message(gen.request_id, _usage(gen)), parts, stop,
                                self.body.shows_thinking)
        return JSONResponse(message.model_dump(), headers=headers)

    def stop(self, gen: Generation, output: CompletionOutput, called: bool) -> Stop:
        window_full = gen.num_prompt_tokens + gen.num_completion_tokens >= self.max_model_len
        return Stop.of(output, list(self.body.stop_sequences or []), called, window_full)


def _usage(gen: Generation) -> Usage:
    """What the engine counted: the prompt split into computed and prefix-cache-read
    tokens (Anthropic's input_tokens and cache_read_input_tokens), and the output."""
    cached = gen.num_cached_tokens
    return Usage(input_tokens=gen.num_prompt_tokens - cached,
                 output_tokens=gen.num_completion_tokens, cache_read_input_tokens=cached)


def _events(events: Iterable[StreamEvent]) -> str:
    return "".join(sse(e, e.type) for e in events)


async def _stream(gen: Generation, answer: _MessageAnswer,
                  message: MessageObject) -> AsyncIterator[str]:
    """message_start at once, then the blocks' events as the text comes (a `ping` every few
    seconds while none does: a long prompt's prefill on a CPU takes minutes, and a client
    hearing nothing gives up), then message_delta and message_stop; an engine failure after
    the headers is the last event, `error`. message_start's usage counts the whole prompt as
    input_tokens (the prefix cache has not been asked yet); message_delta's splits it."""
    writer = MessageEventWriter(message, answer.body.shows_thinking)
    reader = answer.chat.plan.reader.stream()
    yield _events(writer.start(_usage(gen)))
    last: CompletionOutput | None = None
    try:
        async for step in with_heartbeats(gen.choices()):
            if step is None:
                yield _events([Ping()])
                continue
            events: list[StreamEvent] = []
            for c in step:
                o = c.output
                # Tokens held back (partial UTF-8, a tag not yet decided) come later.
                if o.text:
                    events += writer.feed(reader.feed(o.text))
                if o.finish_reason is not None:
                    events += writer.feed(reader.finish())
                    last = o
            if events:
                yield _events(events)
    except (RequestFailed, EngineDeadError) as exc:
        error = gen.failure_error(exc)
        body_error = error.anthropic_body()["error"]
        yield _events([ErrorEvent(error=ErrorDetail(**body_error))])
        return
    stop = answer.stop(gen, last, writer.called) if last is not None else Stop("end_turn")
    yield _events(writer.finish(stop, _usage(gen)))

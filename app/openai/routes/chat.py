"""POST /v1/chat/completions."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from officellm.app.admission.auth import get_principal
from officellm.app.chat.chat_formats import ChatPlan
from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts
from officellm.app.errors import invalid_value
from officellm.app.models.prompt import ChatPrompt
from officellm.app.models.served_model import ServedModel
from officellm.app.openai.answers import (
    ERROR_RESPONSES,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    error_response,
    sse_description,
)
from officellm.app.openai.logprobs import chat_logprobs
from officellm.app.openai.protocol import ChatCompletionRequest
from officellm.app.openai.sse import DONE, KEEPALIVE, SSEResponse, sse
from officellm.app.principal import Principal
from officellm.app.serving.generation import Choice, Generation, RequestFailed
from officellm.app.serving.generation_pipeline import ChatInput, GenerationCall, run_generation
from officellm.app.serving.heartbeats import with_heartbeats
from officellm.app.serving.state import ServerState, admitted_server
from officellm.engine import EngineDeadError

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/chat/completions", response_model=ChatCompletion,
             responses=sse_description(ChatCompletionChunk))
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           principal: Principal = Depends(get_principal),
                           server: ServerState = Depends(admitted_server)) -> Response:
    """OpenAI's chat completions, streaming or not: admission, the prompt, the engine."""

    def read(model: ServedModel) -> ChatInput:
        try:
            # Tools, tool_choice and the output constraint decide the grammar and the reading.
            plan = model.chat_formats.plan(body.tool_request(), body.output_constraint())
            params = body.sampling_params(plan.constraint.spec if plan.constraint else None)
        except ValueError as exc:
            raise invalid_value(exc) from exc
        try:
            messages = plan.messages([m.to_template_dict() for m in body.messages])
        except ValueError as exc:
            raise invalid_value(exc) from exc
        return ChatInput(messages, plan, params, model.name)

    call = GenerationCall("chat", f"chatcmpl-{uuid.uuid4().hex}", body.user, body.stream,
                    body.model, body.n or 1, body.add_generation_prompt,
                    body.template_kwargs())
    return await run_generation(server, request, principal, call, read,
                                lambda chat: _ChatAnswer(body, chat.model, chat.plan))


@dataclass(frozen=True)
class _ChatAnswer:
    """A chat completion, its chunks, or a policy's notice as an assistant reply."""

    body: ChatCompletionRequest
    model: str  # the served name the answer reports
    plan: ChatPlan  # how each choice's text is read: content, reasoning, tool calls

    def notice(self, prompt: ChatPrompt) -> Response:
        return _notice(prompt, self.body, self.model)

    def stream(self, gen: Generation, headers: dict[str, str] | None) -> Response:
        return SSEResponse(_stream(gen, self.body, self.model, self.plan), on_close=gen.close,
                           headers=headers)

    def whole(self, gen: Generation, choices: list[Choice],
              headers: dict[str, str] | None) -> Response:
        answer = _response(gen, choices, self.body, self.model, self.plan)
        return JSONResponse(answer.model_dump(), headers=headers)


def _notice(prompt: ChatPrompt, body: ChatCompletionRequest, model: str) -> Response:
    """on_limit=notify: a normal assistant reply carrying the policy's sentence, so chat UIs
    that hide errors still show it. No engine call, so no tokens are used."""
    text = prompt.decision.message or ""
    rid, created, n = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.n or 1
    usage = Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    if not body.stream:
        return JSONResponse(ChatCompletion(
            id=rid, created=created, model=model, usage=usage,
            choices=[ChatChoice(index=i, message=AssistantMessage(content=text), logprobs=None,
                                finish_reason="stop", stop_reason=None) for i in range(n)],
        ).model_dump())

    async def events() -> AsyncIterator[str]:
        def chunk(choice: ChatChunkChoice) -> str:
            return sse(_chunk(rid, created, model, [choice], body.include_usage))
        for i in range(n):
            yield chunk(ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content="")))
            yield chunk(ChatChunkChoice(index=i, delta=ChatDelta(content=text)))
            yield chunk(ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason="stop",
                                        stop_reason=None))
        if body.include_usage:
            yield sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=[],
                                          usage=usage))
        yield DONE
    return SSEResponse(events(), on_close=lambda: None)


def _chunk(rid: str, created: int, model: str, choices: list[ChatChunkChoice],
           include_usage: bool) -> ChatCompletionChunk:
    """A chunk with choices; `usage: null` on it only with include_usage (as OpenAI)."""
    chunk = ChatCompletionChunk(id=rid, created=created, model=model, choices=choices)
    if include_usage:
        chunk.usage = None  # set, so it is sent
    return chunk


def _logprobs(gen: Generation, c: Choice, k: int) -> ChatLogprobs | None:
    if c.output.logprobs is None:
        return None
    return ChatLogprobs(content=chat_logprobs(c.output.token_ids, c.output.logprobs, k,
                                              gen.model.token_text))


def _finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI's "tool_calls" for a choice that ended by calling (not one cut by length)."""
    return "tool_calls" if called and reason == "stop" else reason


def _message(parts: ChatMessageParts) -> AssistantMessage:
    message = AssistantMessage(content=parts.content)
    if parts.tool_calls:
        message.tool_calls = [ToolCall(id=t.id, function=FunctionCall(name=t.name,
                                                                      arguments=t.arguments))
                              for t in parts.tool_calls]
    if parts.reasoning is not None:
        message.reasoning_content = message.reasoning = parts.reasoning
    return message


def _delta(parts: ChatDeltaParts) -> ChatDelta:
    delta = ChatDelta()
    if parts.content:
        delta.content = parts.content
    if parts.reasoning:
        delta.reasoning_content = delta.reasoning = parts.reasoning
    if parts.tool_calls:
        delta.tool_calls = [
            ToolCallDelta(index=t.index, function=FunctionCallDelta(arguments=t.arguments))
            for t in parts.tool_calls]
        for wire, t in zip(delta.tool_calls, parts.tool_calls):
            if t.id is not None:
                wire.id, wire.type = t.id, "function"
            if t.name is not None:
                wire.function.name = t.name
    return delta


def _response(gen: Generation, choices: list[Choice], body: ChatCompletionRequest,
              model: str, plan: ChatPlan) -> ChatCompletion:
    k = body.top_logprobs or 0
    out = []
    for c in choices:
        parts = plan.reader.message(c.output.text)
        out.append(ChatChoice(index=c.index, message=_message(parts),
                              logprobs=_logprobs(gen, c, k),
                              finish_reason=_finish_reason(c.output.finish_reason,
                                                           bool(parts.tool_calls)),
                              stop_reason=c.output.stop_reason))
    return ChatCompletion(id=gen.request_id, created=gen.created, model=model,
                          usage=Usage(**gen.usage()), choices=out)


async def _stream(gen: Generation, body: ChatCompletionRequest, model: str,
                  plan: ChatPlan) -> AsyncIterator[str]:
    include_usage = body.include_usage
    k = body.top_logprobs or 0
    readers = [plan.reader.stream() for _ in range(gen.num_choices)]
    called = [False] * gen.num_choices

    def chunk(choice: ChatChunkChoice) -> str:
        return sse(_chunk(gen.request_id, gen.created, model, [choice], include_usage))

    # OpenAI's first chunk carries the role (and empty content), one per choice.
    for index in range(gen.num_choices):
        yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content="")))
    try:
        async for step in with_heartbeats(gen.choices()):
            if step is None:  # a long prefill: say something, or the client may give up
                yield KEEPALIVE
                continue
            for c in step:
                o = c.output
                parts = readers[c.index].feed(o.text) if o.text else ChatDeltaParts()
                if o.finish_reason is not None:
                    end = readers[c.index].finish()
                    parts.content += end.content
                    parts.reasoning += end.reasoning
                    parts.tool_calls += end.tool_calls
                called[c.index] |= bool(parts.tool_calls)
                # Tokens held back (partial UTF-8, a tag not yet decided) come later.
                if parts or o.logprobs:
                    yield chunk(ChatChunkChoice(index=c.index, delta=_delta(parts),
                                                logprobs=_logprobs(gen, c, k), stop_reason=None))
                if o.finish_reason is not None:
                    yield chunk(ChatChunkChoice(
                        index=c.index, delta=ChatDelta(),
                        finish_reason=_finish_reason(o.finish_reason, called[c.index]),
                        stop_reason=o.stop_reason))
    except (RequestFailed, EngineDeadError) as exc:
        # Headers are sent: the error travels as the last event, in OpenAI's shape.
        yield sse(error_response(gen.failure_error(exc)))
        return
    if include_usage:
        yield sse(ChatCompletionChunk(id=gen.request_id, created=gen.created, model=model,
                                      choices=[], usage=Usage(**gen.usage())))
    yield DONE

"""POST /v1/responses: OpenAI's Responses API, stateless, on the chat pipeline."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from officellm.app.admission.auth import get_principal
from officellm.app.chat.chat_formats import ChatPlan
from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts
from officellm.app.errors import invalid_value
from officellm.app.models.prompt import ChatPrompt
from officellm.app.models.served_model import ServedModel
from officellm.app.openai.answers import ERROR_RESPONSES
from officellm.app.openai.responses_api_models import (
    CustomToolEcho,
    CustomToolFormatEcho,
    FunctionToolEcho,
    InputTokensDetails,
    JSONSchemaTextFormat,
    NamedToolChoiceEcho,
    NamespaceToolEcho,
    OutputTokensDetails,
    PlainTextFormat,
    ReasoningEcho,
    ResponseError,
    ResponseObject,
    ResponseStreamEvent,
    ResponseUsage,
    TextConfigEcho,
    event_stream_description,
)
from officellm.app.openai.responses_output import ResponseEventWriter, output_items, response_status
from officellm.app.openai.responses_protocol import (
    CustomTool,
    CustomToolChoice,
    FunctionTool,
    FunctionToolChoice,
    NamespaceTool,
    ResponsesRequest,
    ToolNames,
    UnsupportedField,
)
from officellm.app.openai.sse import SSEResponse, sse
from officellm.app.principal import Principal
from officellm.app.serving.generation import Choice, Generation, RequestFailed
from officellm.app.serving.generation_pipeline import ChatInput, GenerationCall, run_generation
from officellm.app.serving.heartbeats import with_heartbeats
from officellm.app.serving.state import ServerState, admitted_server
from officellm.engine import EngineDeadError, SamplingParams

logger = logging.getLogger("officellm.server")
router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/responses", response_model=ResponseObject,
             responses=event_stream_description())
async def create_response(body: ResponsesRequest, request: Request,
                          principal: Principal = Depends(get_principal),
                          server: ServerState = Depends(admitted_server)) -> Response:
    """OpenAI's Responses API, streaming or not, without stored state: the chat route's
    admission, prompt, length rules, tools, output constraint and engine, answered as a
    response object (or its events)."""

    def read(model: ServedModel) -> ChatInput:
        try:
            body.check_supported()
            # Tools, tool_choice and text.format decide the grammar and the reading, as in chat.
            plan = model.chat_formats.plan(body.tool_request(), body.output_constraint())
            params = body.sampling_params(plan.constraint.spec if plan.constraint else None)
        except UnsupportedField as exc:
            raise invalid_value(exc, exc.param) from exc
        except ValueError as exc:
            raise invalid_value(exc) from exc
        try:
            messages = plan.messages(body.messages())
        except ValueError as exc:
            raise invalid_value(exc) from exc
        return ChatInput(messages, plan, params, model.name)

    call = GenerationCall("responses", f"resp_{uuid.uuid4().hex}", body.user, body.stream, body.model,
                    template_kwargs=body.template_kwargs())
    if body.skipped_tools:
        # Once per request, as clients send them with every request (Codex: web_search).
        logger.info("%s: hosted tools left out (this server cannot run them): %s",
                    call.request_id, ", ".join(sorted(set(body.skipped_tools))))
    return await run_generation(server, request, principal, call, read,
                                lambda chat: _ResponseAnswer(body, chat))


@dataclass(frozen=True)
class _ResponseAnswer:
    """A response object, its events, or a policy's notice as the answer."""

    body: ResponsesRequest
    chat: ChatInput

    def notice(self, prompt: ChatPrompt) -> Response:
        return _notice(prompt.decision.message or "", self.body, self.chat.params,
                       self.chat.model)

    def _in_progress(self, gen: Generation) -> ResponseObject:
        return _in_progress(gen.request_id, gen.created, self.body, self.chat.params,
                            self.chat.model)

    def stream(self, gen: Generation, headers: dict[str, str] | None) -> Response:
        return SSEResponse(_stream(gen, self.chat.plan, self._in_progress(gen),
                                   self.body.tool_names),
                           on_close=gen.close, headers=headers)

    def whole(self, gen: Generation, choices: list[Choice],
              headers: dict[str, str] | None) -> Response:
        return JSONResponse(_completed(gen, choices[0], self.chat.plan, self._in_progress(gen),
                                       self.body.tool_names).model_dump(), headers=headers)


def _in_progress(response_id: str, created: int, body: ResponsesRequest, params: SamplingParams,
                 model: str) -> ResponseObject:
    """The response before any output: the request's settings echoed, as OpenAI's are."""
    fmt = body.text.format if body.text is not None else None
    text_format = (JSONSchemaTextFormat(name=fmt.name, schema=fmt.schema_,
                                        description=fmt.description, strict=fmt.strict)
                   if fmt is not None and fmt.type == "json_schema"
                   else PlainTextFormat(type=fmt.type if fmt is not None else "text"))
    choice = body.tool_choice or "auto"
    reasoning = body.reasoning
    return ResponseObject(
        id=response_id, created_at=created, status="in_progress",
        instructions=body.instructions, max_output_tokens=body.max_output_tokens, model=model,
        output=[], parallel_tool_calls=body.parallel_tool_calls,
        reasoning=ReasoningEcho(effort=reasoning.effort if reasoning else None,
                                summary=reasoning.summary if reasoning else None),
        temperature=params.temperature, top_p=params.top_p,
        text=TextConfigEcho(format=text_format,
                            verbosity=body.text.verbosity if body.text is not None else None),
        tool_choice=(NamedToolChoiceEcho(type=choice.type, name=choice.name)
                     if isinstance(choice, FunctionToolChoice | CustomToolChoice) else choice),
        tools=[_tool_echo(t) for t in body.tools or []],
        user=body.user, metadata=body.metadata or {})


def _function_echo(tool: FunctionTool) -> FunctionToolEcho:
    return FunctionToolEcho(name=tool.name, description=tool.description,
                            parameters=tool.parameters, strict=tool.strict)


def _custom_echo(tool: CustomTool) -> CustomToolEcho:
    fmt = tool.format
    return CustomToolEcho(name=tool.name, description=tool.description,
                          format=CustomToolFormatEcho(type=fmt.type, syntax=fmt.syntax,
                                                      definition=fmt.definition))


def _tool_echo(tool: FunctionTool | CustomTool | NamespaceTool
               ) -> FunctionToolEcho | CustomToolEcho | NamespaceToolEcho:
    if isinstance(tool, NamespaceTool):
        return NamespaceToolEcho(name=tool.name, description=tool.description,
                                 tools=[_custom_echo(t) if isinstance(t, CustomTool)
                                        else _function_echo(t) for t in tool.tools])
    if isinstance(tool, CustomTool):
        return _custom_echo(tool)
    return _function_echo(tool)


def _usage(input_tokens: int, cached_tokens: int, output_tokens: int) -> ResponseUsage:
    return ResponseUsage(input_tokens=input_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
                         output_tokens=output_tokens,
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
                         total_tokens=input_tokens + output_tokens)


def _generation_usage(gen: Generation) -> ResponseUsage:
    """What the engine counted for this request (the same numbers its accounting records)."""
    return _usage(gen.num_prompt_tokens, gen.num_cached_tokens, gen.num_completion_tokens)


def _completed(gen: Generation, choice: Choice, plan: ChatPlan, response: ResponseObject,
               names: ToolNames) -> ResponseObject:
    status, details = response_status(choice.output.finish_reason)
    items = output_items(plan.reader.message(choice.output.text), status == "incomplete",
                         names)
    return response.model_copy(update={"status": status, "incomplete_details": details,
                                       "output": items, "usage": _generation_usage(gen)})


def _events(events: Iterable[ResponseStreamEvent]) -> str:
    return "".join(sse(e, e.type) for e in events)


async def _stream(gen: Generation, plan: ChatPlan, response: ResponseObject,
                  names: ToolNames) -> AsyncIterator[str]:
    writer = ResponseEventWriter(response, names)
    reader = plan.reader.stream()
    yield _events(writer.start())
    finish_reason = None
    try:
        async for step in with_heartbeats(gen.choices()):
            if step is None:
                yield _events(writer.heartbeat())
                continue
            for c in step:
                o = c.output
                # Tokens held back (partial UTF-8, a tag not yet decided) come later.
                events = writer.feed(reader.feed(o.text)) if o.text else []
                if o.finish_reason is not None:
                    events += writer.feed(reader.finish())
                    finish_reason = o.finish_reason
                if events:
                    yield _events(events)
    except (RequestFailed, EngineDeadError) as exc:
        # Headers are sent: the failure travels as the last event, response.failed.
        error = gen.failure_error(exc)
        yield _events(writer.fail(ResponseError(code="server_error", message=error.message)))
        return
    yield _events(writer.finish(finish_reason, _generation_usage(gen)))


def _notice(text: str, body: ResponsesRequest, params: SamplingParams, model: str) -> Response:
    """on_limit=notify: a normal answer carrying the policy's sentence, so clients that hide
    errors still show it. No engine call, so no tokens are used."""
    response = _in_progress(f"resp_{uuid.uuid4().hex}", int(time.time()), body, params, model)
    usage = _usage(0, 0, 0)
    if not body.stream:
        items = output_items(ChatMessageParts(text, None, []), incomplete=False)
        return JSONResponse(response.model_copy(update={
            "status": "completed", "output": items, "usage": usage}).model_dump())

    async def events() -> AsyncIterator[str]:
        writer = ResponseEventWriter(response)
        yield _events([*writer.start(), *writer.feed(ChatDeltaParts(content=text)),
                       *writer.finish("stop", usage)])
    return SSEResponse(events(), on_close=lambda: None)

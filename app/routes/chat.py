"""POST /v1/chat/completions."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from app.async_engine import EngineDeadError
from app.auth import Principal, get_principal
from app.errors import APIError
from app.generation import Delta, Generation, RequestFailed
from app.logprobs import chat_logprobs
from app.policy_gate import ThreadPlan, admit, check_thread
from app.prompts import ChatPrompt
from app.protocol import ChatCompletionRequest
from app.sse import DONE, SSEResponse, sse
from app.state import ServerState, admitted_server

TRUNCATED_HEADER = "X-OfficeLLM-Truncated"

router = APIRouter()
logger = logging.getLogger("officellm.server")


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           principal: Principal = Depends(get_principal),
                           server: ServerState = Depends(admitted_server)) -> Response:
    """OpenAI's chat completions, streaming or not, after the user's policy (policy_gate)."""
    model = server.resolve_model(body.model)
    try:
        params = body.sampling_params()
        messages = [m.to_template_dict() for m in body.messages]
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    ticket = await admit(server, principal, "chat")  # 429: daily quota, concurrency
    try:
        # DESIGN §6: the client's thread id (header, else the `user` field), else the opening.
        plan = await check_thread(server, ticket, messages, body.add_generation_prompt,
                                  body.chat_template_kwargs or {},
                                  request.headers.get("x-thread-id") or body.user)
        if plan.decision.action == "notify":
            ticket.finish()  # the engine never runs: nothing to count
            return _notice(plan, body, model)
        prompt = plan.prompt if plan.prompt is not None else ChatPrompt(
            plan.messages, body.add_generation_prompt, body.chat_template_kwargs or {})
        gen = Generation(server, f"chatcmpl-{uuid.uuid4().hex}", [prompt], params, ticket,
                         endpoint="chat", stream=body.stream, thread=ticket.thread_key)
    except BaseException:
        ticket.finish()
        raise
    headers = {TRUNCATED_HEADER: str(plan.truncated_turns)} if plan.truncated_turns else None
    await gen.start()
    if body.stream:
        return SSEResponse(_stream(gen, body, model), on_close=gen.close, headers=headers)
    if not await gen.complete(request):
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"
    return JSONResponse(_response(gen, body, model), headers=headers)


def _notice(plan: ThreadPlan, body: ChatCompletionRequest, model: str) -> Response:
    """on_limit=notify: a normal assistant reply carrying the policy's sentence, so chat UIs
    that hide errors still show it. No engine call, so no tokens are used."""
    text = plan.decision.message or ""
    rid, created, n = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.n or 1
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if not body.stream:
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}
                        for i in range(n)],
            "usage": usage})

    async def events() -> AsyncIterator[str]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": choices, **extra})
        tail = {"usage": None} if body.include_usage else {}
        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}], **tail)
            yield chunk([{"index": i, "delta": {"content": text}, "logprobs": None,
                          "finish_reason": None}], **tail)
            yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": "stop",
                          "stop_reason": None}], **tail)
        if body.include_usage:
            yield chunk([], usage=usage)
        yield DONE
    return SSEResponse(events(), on_close=lambda: None)


def _logprobs(gen: Generation, token_ids: list[int], entries: Any, k: int) -> dict | None:
    if entries is None:
        return None
    return {"content": chat_logprobs(token_ids, entries, k, gen.server.token_text)}


def _response(gen: Generation, body: ChatCompletionRequest, model: str) -> dict[str, Any]:
    k = body.top_logprobs or 0
    choices = [{
        "index": c.index,
        "message": {"role": "assistant", "content": c.text},
        "logprobs": _logprobs(gen, c.token_ids, c.logprobs, k),
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    } for c in gen.choices]
    return {"id": gen.request_id, "object": "chat.completion", "created": gen.created,
            "model": model, "choices": choices, "usage": gen.usage()}


async def _stream(gen: Generation, body: ChatCompletionRequest, model: str) -> AsyncIterator[str]:
    include_usage = body.include_usage
    k = body.top_logprobs or 0

    def chunk(choices: list[dict[str, Any]]) -> str:
        payload: dict[str, Any] = {"id": gen.request_id, "object": "chat.completion.chunk",
                                   "created": gen.created, "model": model, "choices": choices}
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    def choice(d: Delta, delta: dict[str, Any]) -> dict[str, Any]:
        return {"index": d.index, "delta": delta,
                "logprobs": _logprobs(gen, d.token_ids, d.logprobs, k),
                "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}

    # OpenAI's first chunk carries the role (and empty content), one per choice.
    for c in gen.choices:
        yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                      "logprobs": None, "finish_reason": None}])
    try:
        async for deltas in gen.deltas():
            for d in deltas:
                if d.text or d.logprobs:  # tokens held back as partial UTF-8 come later
                    content = choice(d, {"content": d.text})
                    content["finish_reason"] = content["stop_reason"] = None
                    yield chunk([content])
                if d.finish_reason is not None:
                    final = choice(d, {})
                    final["logprobs"] = None
                    yield chunk([final])
    except (RequestFailed, EngineDeadError) as exc:
        # Headers are sent: the error travels as the last event, in OpenAI's shape.
        yield sse(gen.failure_error(exc).body())
        return
    if include_usage:
        yield sse({"id": gen.request_id, "object": "chat.completion.chunk", "created": gen.created,
                   "model": model, "choices": [], "usage": gen.usage()})
    yield DONE

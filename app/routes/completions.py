"""POST /v1/completions (the legacy text API; a batch of prompts is allowed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from app.async_engine import EngineDeadError
from app.auth import Principal, get_principal
from app.errors import APIError
from app.generation import Generation, RequestFailed
from app.logprobs import completion_logprobs
from app.policy_gate import admit
from app.protocol import CompletionRequest
from app.sse import DONE, SSEResponse, sse
from app.state import ServerState, admitted_server

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request,
                      principal: Principal = Depends(get_principal),
                      server: ServerState = Depends(admitted_server)) -> Response:
    """OpenAI's text completions, streaming or not; quota and concurrency apply (threads are a
    chat notion, so no thread limits here)."""
    model = server.resolve_model(body.model)
    try:
        params = body.sampling_params()
        prompts = body.prompts()
    except ValueError as exc:
        raise APIError(400, str(exc), param="prompt") from exc
    ticket = await admit(server, principal, "completions")  # 429: daily quota, concurrency
    try:
        gen = Generation(server, f"cmpl-{uuid.uuid4().hex}", prompts, params, ticket,
                         endpoint="completions", stream=body.stream)
    except BaseException:
        ticket.finish()
        raise
    await gen.start()
    if body.stream:
        return SSEResponse(_stream(gen, body, model), on_close=gen.close)
    if not await gen.complete(request):
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"
    return JSONResponse(_response(gen, body, model))


def _echo_text(gen: Generation, prompt_index: int) -> str:
    prompt = gen.prompts[prompt_index]
    if isinstance(prompt, str):
        return prompt
    return gen.server.token_text.decode(gen.prompt_token_ids[prompt_index])


def _response(gen: Generation, body: CompletionRequest, model: str) -> dict[str, Any]:
    choices = []
    for c in gen.choices:
        prompt_index = c.index // gen.params.n
        prefix = _echo_text(gen, prompt_index) if body.echo else ""
        lps = None
        if c.logprobs is not None and body.logprobs is not None:
            lps = completion_logprobs(c.token_ids, c.logprobs, body.logprobs,
                                      gen.server.token_text, len(prefix))
        choices.append({"index": c.index, "text": prefix + c.text, "logprobs": lps,
                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    return {"id": gen.request_id, "object": "text_completion", "created": gen.created,
            "model": model, "choices": choices, "usage": gen.usage()}


async def _stream(gen: Generation, body: CompletionRequest, model: str) -> AsyncIterator[str]:
    include_usage = body.include_usage
    offsets = [0] * len(gen.choices)  # characters sent so far, for logprobs' text_offset

    def chunk(index: int, text: str, logprobs: Any, finish: str | None,
              stop_reason: Any = None) -> str:
        payload: dict[str, Any] = {
            "id": gen.request_id, "object": "text_completion", "created": gen.created,
            "model": model, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                         "finish_reason": finish, "stop_reason": stop_reason}]}
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    if body.echo:
        for c in gen.choices:
            text = _echo_text(gen, c.index // gen.params.n)
            offsets[c.index] = len(text)
            yield chunk(c.index, text, None, None)
    try:
        async for deltas in gen.deltas():
            for d in deltas:
                if not (d.text or d.logprobs or d.finish_reason):
                    continue
                lps = None
                if d.logprobs is not None and body.logprobs is not None:
                    lps = completion_logprobs(d.token_ids, d.logprobs, body.logprobs,
                                              gen.server.token_text, offsets[d.index])
                offsets[d.index] += len(d.text)
                yield chunk(d.index, d.text, lps, d.finish_reason, d.stop_reason)
    except (RequestFailed, EngineDeadError) as exc:
        # Headers are sent: the error travels as the last event, in OpenAI's shape.
        yield sse(gen.failure_error(exc).body())
        return
    if include_usage:
        yield sse({"id": gen.request_id, "object": "text_completion", "created": gen.created,
                   "model": model, "choices": [], "usage": gen.usage()})
    yield DONE

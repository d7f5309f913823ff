"""Server-sent events as OpenAI streams them: `data: {json}\n\n` ... `data: [DONE]\n\n`
(chat and completions), or `event: <type>\ndata: {json}\n\n` each (the Responses API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"
# A stream's heartbeat where the API has no event for one (Chat Completions, Completions): an
# SSE comment, which every SSE client skips (the spec's rule; the openai SDKs follow it).
KEEPALIVE = ": keepalive\n\n"


# Characters that are legal raw inside a JSON string but that str.splitlines() takes for line
# ends: clients that split an SSE stream that way (httpx's aiter_lines) would cut an event in
# two mid-string when a model generates one. The other line breaks (\n, \r, \x0b, \x0c,
# \x1c-\x1e) are control characters, which JSON escapes already.
_SPLITLINES_SAFE = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028",
                                  "\u2029": "\\u2029"})


def sse(payload: BaseModel, event: str | None = None) -> str:
    """One SSE event carrying a chunk (app/openai/answers.py) as compact JSON. Nulls stay:
    which fields a chunk leaves out is the model's (WireModel.omit_unset), not exclude_none.
    `event` names the event on an `event:` line first, as the Responses API's streams do."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {payload.model_dump_json().translate(_SPLITLINES_SAFE)}\n\n"


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close` when the response ends, however it ends.

    Starlette cancels the body iterator when the client disconnects, and an async generator
    cancelled while suspended at a `yield` never runs its `finally`; this hook does not
    depend on that, so an abandoned request is always aborted at once.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                  **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

"""Server-sent events as OpenAI streams them: `data: {json}\n\n` ... `data: [DONE]\n\n`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    """One SSE event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


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

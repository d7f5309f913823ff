"""Refuse oversized request bodies early (413), before anything parses them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from officellm.app.errors import APIError


class BodySizeLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 in OpenAI's shape.

    A declared Content-Length is checked before a byte is read; a chunked body is read up to
    the limit and refused as soon as it passes it, so a 10 MB upload never sits in memory whole.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than this server's limit of "
                             f"{self.max_bytes:,} bytes.", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large().response_for(scope["path"])(scope, receive, send)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        # No length given (chunked): buffer up to the limit, then replay to the app.
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._too_large().response_for(scope["path"])(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

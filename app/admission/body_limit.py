"""Refuse oversized request bodies early (413), before anything parses them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from officellm.app.errors import APIError


class BodySizeLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 in OpenAI's shape.

    A declared Content-Length is checked before a byte is read; a chunked body is read up to
    the limit and refused as soon as it passes it, so a 10 MB upload never sits in memory whole.
    """

    def __init__(self, app: ASGIApp, max_bytes: int,
                 path_limits: dict[str, int] | None = None) -> None:
        # path_limits: a path prefix's own limit (the audio uploads' --audio-max-bytes).
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = path_limits or {}

    def _limit(self, path: str) -> int:
        return next((n for prefix, n in self.path_limits.items() if path.startswith(prefix)),
                    self.max_bytes)

    def _too_large(self, limit: int) -> APIError:
        return APIError(413, f"The request body is larger than this server's limit of "
                             f"{limit:,} bytes.", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self._limit(scope.get("path", "")) if scope["type"] == "http" else 0
        if scope["type"] != "http" or limit <= 0:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._too_large(limit).response_for(scope["path"])(scope, receive, send)
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
            if total > limit:
                await self._too_large(limit).response_for(scope["path"])(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

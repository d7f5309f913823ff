"""Every answer names the replica that gave it (`X-Officellm-Replica`): behind a router, the
admin and the tests can see which replica served a person."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPLICA_HEADER = "X-Officellm-Replica"


class ReplicaHeader:
    """ASGI middleware adding the header to every HTTP answer, streamed ones included."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self._header = (REPLICA_HEADER.lower().encode(), name.encode("utf-8"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self._header]}
            await send(message)

        await self.app(scope, receive, named)

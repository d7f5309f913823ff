"""One streaming chat completion, timed chunk by chunk, counted by the server's usage."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    """What one request did. Times are seconds on the runner's clock (time.perf_counter)."""

    user: int
    turn: int  # 0-based turn within the user's current conversation
    kind: str  # "chat", "paste", "burst", "shared-prefix"
    start: float
    max_tokens: int
    conversation: int = 0  # a user starts a new conversation when the context would overflow
    first_token: float | None = None
    end: float | None = None
    # Arrival time of every chunk that carried content: ITL is the gap between neighbours.
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.completion_tokens is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for one-token replies."""
        if not self.ok or self.first_token is None or (self.completion_tokens or 0) < 2:
            return None
        return (self.end - self.first_token) / (self.completion_tokens - 1)  # type: ignore[operator]


@dataclass
class ChatClient:
    """Sends chat completions to one server; `extra` goes into every body (e.g. ignore_eos).
    `user_keys`: a bearer key per simulated user, instead of the client's own, so the server
    tells them apart (noisy-neighbour's heavy user is another person)."""

    http: httpx.AsyncClient
    model: str
    extra: dict[str, Any] = field(default_factory=dict)
    user_keys: dict[int, str] = field(default_factory=dict)

    async def chat(self, record: RequestRecord, messages: list[dict[str, str]],
                   on_first_token: Callable[[], None] | None = None) -> RequestRecord:
        """Stream one reply into `record` (filled in place and returned), calling
        `on_first_token` when its first token arrives; never raises for server or transport
        errors: they land in record.error so one failure does not stop a run.
        """
        body = {"model": self.model, "messages": messages, "max_tokens": record.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, **self.extra}
        parts: list[str] = []
        key = self.user_keys.get(record.user)
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body,
                                        headers=headers) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:300]
                    record.error = f"HTTP {resp.status_code}: {detail}"
                    return record
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    waiting = record.first_token is None
                    self._on_chunk(record, json.loads(data), parts, time.perf_counter())
                    if waiting and record.first_token is not None and on_first_token:
                        on_first_token()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.end = time.perf_counter()
        record.text = "".join(parts)
        if record.error is None and record.completion_tokens is None:
            record.error = "stream ended without usage"
        return record

    @staticmethod
    def _on_chunk(record: RequestRecord, chunk: dict[str, Any], parts: list[str],
                  now: float) -> None:
        if "error" in chunk:
            record.error = f"stream error: {chunk['error']}"
            return
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                if record.first_token is None:
                    record.first_token = now
                record.chunk_times.append(now)
                parts.append(content)
        usage = chunk.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")

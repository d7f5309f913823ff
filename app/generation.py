"""One client request's generation: admission, streaming deltas, abort, accounting, access log.

A request may hold several engine requests (a completions batch of prompts); their outputs
share one queue. Choice i*n + j is prompt i's j-th sequence, as in OpenAI's API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from app.async_engine import EngineDeadError, RequestAborted
from app.errors import APIError, unavailable
from app.overload import queue_full
from app.policy import prefix_cache_salt
from app.policy_gate import Ticket
from app.prompts import ChatPrompt, ContextLimitError, PromptBuilder
from app.state import ServerState
from engine import Logprob, PromptTooLongError, RequestOutput, SamplingParams

access_log = logging.getLogger("officellm.access")

T = TypeVar("T")


@dataclass
class Choice:
    """One output sequence, accumulated."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class Delta:
    """What one engine step added to one choice."""

    index: int
    prompt_index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


class RequestFailed(RuntimeError):
    """The engine failed this request alone (NaN logits, a tokenizer error in its output):
    a 500 for this client, while the engine and every other request go on. A dead engine
    is EngineDeadError instead (503: the server as a whole cannot serve)."""


class Generation:
    """Drives the engine requests behind one HTTP request."""

    def __init__(self, server: ServerState, request_id: str, prompts: list[str | list[int] | ChatPrompt],
                 params: SamplingParams, ticket: Ticket, *, endpoint: str, stream: bool,
                 thread: str | None = None) -> None:
        self.server = server
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.ticket = ticket  # the policy gate's admission: finished by close()
        self.principal = ticket.principal
        self.endpoint = endpoint
        self.stream = stream
        self.thread = thread
        self.engine_ids = ([request_id] if len(prompts) == 1
                           else [f"{request_id}-{i}" for i in range(len(prompts))])
        self.prompt_token_ids: list[list[int]] = []
        self.choices = [Choice(i) for i in range(len(prompts) * params.n)]
        self.created = int(time.time())
        self._queue: asyncio.Queue = asyncio.Queue()
        self._unfinished: set[str] = set()
        self._t0 = time.monotonic()
        self._first_token: float | None = None
        self._closed = False
        self._entered = False
        self._queued = False  # holds room in the bounded waiting queue (server.admission)
        self._failure: int | None = None  # 500 (this request failed) or 503 (engine died)

    # -- admission -----------------------------------------------------------------------
    async def start(self) -> None:
        """Admit every prompt, or none: raises APIError (400/429/503) for the client."""
        server = self.server
        if not server.admission.try_enter(self.num_sequences):
            server.metrics.record_refusal(self.principal.user, "queue_full")
            self.close(status=429)
            raise queue_full(server.admission, server.settings.retry_after_s)
        self._queued = True
        server.lifecycle.enter()
        self._entered = True
        server.metrics.in_flight.inc()
        engine = server.async_engine
        cap = server.settings.max_context_tokens
        try:
            for eid, prompt in zip(self.engine_ids, self.prompts, strict=True):
                # Marked before awaiting: if the client leaves while the command is queued,
                # close() still aborts it (the abort is queued after the add, so it lands).
                self._unfinished.add(eid)
                _, ids = await engine.add_request(
                    eid, PromptBuilder(prompt, cap), self.params, user=self.principal.user,
                    thread=self.thread, sink=self._queue,
                    # DESIGN §6: the prefix cache is salted per user, so one user cannot time
                    # another's cached prompts, unless their policy lets them share. Set
                    # here, never by the client.
                    cache_salt=prefix_cache_salt(self.principal.user_id,
                                                 self.ticket.policy.share_prefix_cache))
                self.prompt_token_ids.append(ids)
        except BaseException as exc:  # includes cancellation by a client that left
            error = self._admission_error(exc)
            if error is None:
                status = 499 if isinstance(exc, asyncio.CancelledError) else 500
            else:
                status = error.status
                self._unfinished.discard(eid)  # refused by the engine: nothing to abort
            self.close(status=status)
            if error is None:
                raise
            raise error from exc

    def _admission_error(self, exc: BaseException) -> APIError | None:
        reason, error = None, None
        if isinstance(exc, PromptTooLongError):
            reason = "context_length"
            error = APIError(400, str(exc), param="messages" if self.endpoint == "chat" else "prompt",
                             code="context_length_exceeded")
        elif isinstance(exc, ContextLimitError):
            reason = "context_cap"
            error = APIError(400, str(exc), code="context_cap_exceeded")
        elif isinstance(exc, EngineDeadError):
            reason = "unavailable"
            error = unavailable(str(exc), self.server.settings.retry_after_s)
        elif isinstance(exc, ValueError):
            reason = "invalid_request"
            error = APIError(400, str(exc))
        if reason is not None:
            self.server.metrics.record_refusal(self.principal.user, reason)
        return error

    # -- outputs -------------------------------------------------------------------------
    async def deltas(self) -> AsyncIterator[list[Delta]]:
        """Yield each engine step's deltas until every choice has finished.

        Raises RequestFailed if the engine fails this request, EngineDeadError if the engine
        dies meanwhile.
        """
        n = self.params.n
        while self._unfinished:
            item = await self._queue.get()
            if isinstance(item, EngineDeadError):
                self._failure = 503
                raise item
            if isinstance(item, RequestAborted):
                yield self._aborted(item.request_id)
                continue
            assert isinstance(item, RequestOutput)
            prompt_index = self.engine_ids.index(item.request_id)
            if item.error:
                self._failure = 500
                raise RequestFailed(item.error)
            out = []
            for o in item.outputs:
                c = self.choices[prompt_index * n + o.index]
                c.text += o.text
                c.token_ids.extend(o.token_ids)
                if o.logprobs is not None:
                    c.logprobs = (c.logprobs or []) + list(o.logprobs)
                c.finish_reason, c.stop_reason = o.finish_reason, o.stop_reason
                out.append(Delta(c.index, prompt_index, o.text, list(o.token_ids), o.logprobs,
                                 o.finish_reason, o.stop_reason))
                if o.token_ids and self._first_token is None:
                    self._first_token = time.monotonic()
            if item.finished:
                self._unfinished.discard(item.request_id)
            yield out

    def _aborted(self, engine_id: str) -> list[Delta]:
        self._unfinished.discard(engine_id)
        prompt_index = self.engine_ids.index(engine_id)
        n = self.params.n
        out = []
        for c in self.choices[prompt_index * n:(prompt_index + 1) * n]:
            if c.finish_reason is None:
                c.finish_reason = "abort"
                out.append(Delta(c.index, prompt_index, "", [], None, "abort", None))
        return out

    async def complete(self, request: Request) -> bool:
        """Run to the end for a non-streaming answer, then close. False if the client left
        first (the request is aborted); APIError 500 if the engine failed this request, 503
        if the engine died."""
        async def consume() -> None:
            async for _ in self.deltas():
                pass
        status = 500  # anything unexpected still closes (aborts, leaves the in-flight count)
        try:
            await until_disconnect(consume(), request)
            status = 200
        except ClientGone:
            status = 499
            return False
        except (RequestFailed, EngineDeadError) as exc:
            error = self.failure_error(exc)
            status = error.status
            raise error from exc
        finally:
            self.close(status)
        return True

    def failure_error(self, exc: RequestFailed | EngineDeadError) -> APIError:
        """What the client is told when the engine fails under this request: 500 in OpenAI's
        shape for a fault in this request alone, 503 with Retry-After for a dead engine."""
        if isinstance(exc, RequestFailed):
            self.server.metrics.record_refusal(self.principal.user, "engine_error")
            return APIError(500, f"The server had an error while processing this request: {exc}",
                            code="internal_error")
        return unavailable(str(exc), self.server.settings.retry_after_s)

    # -- accounting ----------------------------------------------------------------------
    @property
    def num_sequences(self) -> int:
        """Engine sequences this request runs: its prompts times n."""
        return len(self.prompts) * self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    def usage(self) -> dict[str, int]:
        p, c = self.num_prompt_tokens, self.num_completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def close(self, status: int = 200) -> None:
        """Abort what is unfinished, leave the in-flight count, write the access line. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._failure is not None and status == 200:
            status = self._failure
        for eid in self._unfinished:
            self.server.async_engine.abort(eid)
        aborted = bool(self._unfinished)
        self._unfinished.clear()
        if self._queued:
            self.server.admission.leave(self.num_sequences)
        if self._entered:
            self.server.lifecycle.leave()
            self.server.metrics.in_flight.dec()
        if status == 200:
            self.server.metrics.record_request(self.principal.user, self.num_prompt_tokens,
                                               self.num_completion_tokens)
        # Usage counts whatever the engine processed, even for a client that left midway:
        # that work was done, and the daily quota is about work.
        self.ticket.finish(self.num_prompt_tokens, self.num_completion_tokens,
                           max((len(c.token_ids) for c in self.choices), default=0))
        now = time.monotonic()
        ttft = f"{self._first_token - self._t0:.3f}s" if self._first_token else "-"
        finish = ",".join(sorted({c.finish_reason or "abort" for c in self.choices})) \
            if self.prompt_token_ids else "-"
        if aborted and status == 200:
            status = 499  # the client went away; nginx's code for it
        # Never the prompt's text: only sizes and timings.
        access_log.info(
            "%s user=%s %s stream=%s status=%d prompt_tokens=%d completion_tokens=%d ttft=%s "
            "duration=%.3fs finish=%s", self.request_id, self.principal.user, self.endpoint,
            self.stream, status, self.num_prompt_tokens, self.num_completion_tokens, ttft,
            now - self._t0, finish)


async def until_disconnect(work: Awaitable[T], request: Request) -> T:
    """Await `work`, but cancel it and raise ClientGone if the client disconnects first.

    The request body has been read, so the next ASGI message can only be the disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

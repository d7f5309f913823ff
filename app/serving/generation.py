"""One client request's generation: its engine requests, their outputs, its accounting.

A request may hold several engine requests (a completions batch of prompts); their outputs
share one queue. Choice i*n + j is prompt i's j-th sequence, as in OpenAI's API. A streamed
request gets every step's deltas; a non-streamed one the engine's final output of each
prompt (the engine's OutputProcessor accumulates; nothing here does).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request

from officellm.app.admission.admission import Admission
from officellm.app.errors import APIError, invalid_value, unavailable
from officellm.app.models.served_model import ServedModel
from officellm.app.policy import prefix_cache_salt, runs_behind_people
from officellm.app.serving.state import ServerState
from officellm.engine import (
    CompletionOutput,
    EngineDeadError,
    MultiModalPrompt,
    OutputKind,
    PromptLogprobs,
    RequestAborted,
    RequestOutput,
    SamplingParams,
    StructuredOutputError,
)

if TYPE_CHECKING:
    import xgrammar as xgr

access_log = logging.getLogger("officellm.access")

T = TypeVar("T")
# What may not reach the access log of a client's word (a task's name may come from a header).
_LOG_UNSAFE = re.compile(r"[^\w.-]")


@dataclass(frozen=True)
class Choice:
    """One sequence's output (a delta while streaming, the whole output otherwise), under
    its OpenAI choice index; `prompt_logprobs` (SamplingParams.prompt_logprobs) on the
    choices of the engine output that brought them (streaming: the prompt's first output
    with a token)."""

    index: int
    prompt_index: int
    output: CompletionOutput
    prompt_logprobs: PromptLogprobs | None = None


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


class RequestFailed(RuntimeError):
    """The engine failed this request alone (NaN logits, a tokenizer error in its output):
    a 500 for this client, while the engine and every other request go on. A dead engine
    is EngineDeadError instead (503: the server as a whole cannot serve)."""


class Generation:
    """Drives the engine requests behind one HTTP request; `close()` ends it (idempotent)."""

    def __init__(self, server: ServerState, model: ServedModel, request_id: str,
                 prompts: list[list[int]], params: SamplingParams, admission: Admission, *,
                 stream: bool,
                 thread_key: str | None = None, turns: int | None = None,
                 grammar: xgr.CompiledGrammar | None = None, kind: str | None = None,
                 task: str | None = None, multimodal: MultiModalPrompt | None = None) -> None:
        """`grammar` is params.structured_outputs compiled (compile_grammar); `kind` names
        the request's structured-output or tool-call kind, for metrics and the access log;
        `task` names the front end's background task it is (app/policy/background_tasks.py;
        None: a person's own request), whose tokens are counted apart and which runs behind
        people's own requests. `multimodal`: the one prompt's images (a chat with images;
        its token_ids are the prompt)."""
        self.server = server
        self.model = model
        self.request_id = request_id
        self.prompt_token_ids = prompts
        if params.max_tokens is None and model.default_max_tokens is not None:
            # The one place a request without max_tokens gets the server's default, whatever
            # its route (a max_tokens past the window still stops at the window).
            params = replace(params, max_tokens=max(model.default_max_tokens,
                                                    params.min_tokens))
        self.params = params
        self.admission = admission
        self.principal = admission.principal
        self.endpoint = admission.endpoint
        self.stream = stream
        self.thread_key = thread_key
        self.turns = turns
        self.grammar = grammar
        self.kind = kind
        self.task = task
        self.multimodal = multimodal
        self.engine_ids = ([request_id] if len(prompts) == 1
                           else [f"{request_id}-{i}" for i in range(len(prompts))])
        self.num_choices = len(prompts) * params.n
        self.created = int(time.time())
        self._queue: asyncio.Queue = asyncio.Queue()
        self._unfinished: set[str] = set()
        self._started: list[int] = []  # indexes of the prompts the engine took
        self._output_tokens = [0] * self.num_choices
        self._cached_tokens: dict[str, int] = {}  # prompt tokens the prefix cache held, by engine id
        self._finish_reasons: list[str | None] = [None] * self.num_choices
        self._t0 = time.monotonic()
        self._first_token: float | None = None
        self._closed = False
        self._failure: int | None = None  # 500 (this request failed) or 503 (engine died)

    def start(self) -> None:
        """Hand every prompt to the engine; raises APIError 503 if it cannot serve."""
        engine = self.model.async_engine
        # docs/design.md §6: the prefix cache is salted per user, so one user cannot time another's
        # cached prompts, unless their policy lets them share. Set here, never by the client.
        salt = prefix_cache_salt(self.principal.user_id, self.admission.policy.share_prefix_cache)
        # docs/design.md §2: the scheduler shares the engine between users by these opaque
        # tags (the user's id, their priority's weight, their KV share cap), made from the
        # policy read at admission, so an admin's change applies from the next request.
        tags = self.admission.scheduling
        # A front end's task is background work: it yields to every person's own prompt.
        background = self.task is not None and runs_behind_people(self.task)
        kind = OutputKind.DELTA if self.stream else OutputKind.FINAL
        try:
            for eid, ids in zip(self.engine_ids, self.prompt_token_ids, strict=True):
                engine.add_request(eid, ids, self.params, kind=kind, cache_salt=salt,
                                   fairness_key=tags.fairness_key, priority=tags.priority,
                                   max_kv_share=tags.max_kv_share, background=background,
                                   grammar=self.grammar, multimodal=self.multimodal,
                                   sink=self._queue)
                self._unfinished.add(eid)
                self._started.append(len(self._started))
        except EngineDeadError as exc:
            self.server.refusals.server_limit(self.principal, "unavailable")
            self.close(503)
            raise unavailable(str(exc), self.server.settings.retry_after_s) from exc
        if self.kind is not None:
            self.server.metrics.record_structured(self.model.name, self.kind)

    async def choices(self) -> AsyncIterator[list[Choice]]:
        """Each engine step's choices until every one has finished. Raises RequestFailed
        if the engine fails this request, EngineDeadError if the engine dies meanwhile."""
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
            if item.error:
                self._failure = 500
                raise RequestFailed(item.error)
            prompt_index = self.engine_ids.index(item.request_id)
            self._cached_tokens[item.request_id] = item.num_cached_tokens
            out = []
            for o in item.outputs:
                index = prompt_index * n + o.index
                self._output_tokens[index] = o.num_output_tokens
                self._finish_reasons[index] = o.finish_reason
                if o.token_ids and self._first_token is None:
                    self._first_token = time.monotonic()
                out.append(Choice(index, prompt_index, o, item.prompt_logprobs))
            if item.finished:
                self._unfinished.discard(item.request_id)
            yield out

    def _aborted(self, engine_id: str) -> list[Choice]:
        self._unfinished.discard(engine_id)
        prompt_index = self.engine_ids.index(engine_id)
        n = self.params.n
        out = []
        for index in range(prompt_index * n, (prompt_index + 1) * n):
            if self._finish_reasons[index] is None:
                self._finish_reasons[index] = "abort"
                out.append(Choice(index, prompt_index,
                                  CompletionOutput(index - prompt_index * n, "", [], "abort",
                                                   num_output_tokens=self._output_tokens[index])))
        return out

    async def complete(self, request: Request) -> list[Choice] | None:
        """Run to the end for a non-streaming answer, then close: every choice, whole, in
        order; None if the client left first (the request is aborted). APIError 500 if the
        engine failed this request, 503 if the engine died."""
        async def collect() -> list[Choice]:
            return [c async for step in self.choices() for c in step]

        status = 500  # anything unexpected still closes (aborts, leaves the in-flight count)
        try:
            result = await until_disconnect(collect(), request)
            status = 200
        except ClientGone:
            status = 499
            return None
        except (RequestFailed, EngineDeadError) as exc:
            error = self.failure_error(exc)
            status = error.status
            raise error from exc
        finally:
            self.close(status)
        return sorted(result, key=lambda c: c.index)

    def failure_error(self, exc: RequestFailed | EngineDeadError) -> APIError:
        """What the client is told when the engine fails under this request: 500 in OpenAI's
        shape for a fault in this request alone, 503 with Retry-After for a dead engine."""
        if isinstance(exc, RequestFailed):
            self.server.refusals.server_limit(self.principal, "engine_error")
            return APIError(500, f"The server had an error while processing this request: {exc}",
                            code="internal_error")
        return unavailable(str(exc), self.server.settings.retry_after_s)

    # -- accounting ----------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens of the prompts the engine took."""
        return sum(len(self.prompt_token_ids[i]) for i in self._started)

    @property
    def num_images(self) -> int:
        """Images in the prompt the engine took (their tokens are in its prompt tokens)."""
        return len(self.multimodal.images) if self.multimodal is not None and self._started else 0

    @property
    def num_completion_tokens(self) -> int:
        return sum(self._output_tokens)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens the engine found in its prefix cache (as it last reported them)."""
        return sum(self._cached_tokens.values())

    def usage(self) -> dict[str, int]:
        p, c = self.num_prompt_tokens, self.num_completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def close(self, status: int = 200) -> None:
        """Abort what is unfinished, record usage and metrics, write the access line."""
        if self._closed:
            return
        self._closed = True
        if self._failure is not None and status == 200:
            status = self._failure
        engine = self.model.async_engine
        for eid in self._unfinished:
            engine.abort(eid)
        aborted = bool(self._unfinished)
        self._unfinished.clear()
        if aborted and status == 200:
            status = 499  # the client went away; nginx's code for it
        prompt, completion = self.num_prompt_tokens, self.num_completion_tokens
        if status == 200:
            self.server.metrics.record_request(self.model.name, self.principal.user, prompt,
                                               completion, task=self.task is not None)
        duration = time.monotonic() - self._t0
        # Usage counts whatever the engine processed, even for a client that left midway:
        # that work was done, and the daily quota is about work.
        if self._started:
            # busy_seconds: from the engine taking the request to its end (docs/admin_api.md).
            self.server.accounts.record_request(self.principal.user_id, prompt, completion,
                                                self.thread_key, self.turns,
                                                max(self._output_tokens, default=0),
                                                model=self.model.name,
                                                cached_tokens=self.num_cached_tokens,
                                                busy_seconds=duration, task=self.task,
                                                images=self.num_images)
            # The user's share across models (app/policy/cross_model.py).
            self.server.admission.cross_model.record(self.principal.user_id, self.model.name,
                                                     prompt + completion)
        ttft = f"{self._first_token - self._t0:.3f}s" if self._first_token else "-"
        task = "" if self.task is None else " task=" + _LOG_UNSAFE.sub("_", self.task)
        finish = (",".join(sorted({f or "abort" for f in self._finish_reasons}))
                  if self._started else "-")
        # Never the prompt's text: only sizes and timings.
        access_log.info(
            "%s user=%s %s stream=%s status=%d prompt_tokens=%d completion_tokens=%d ttft=%s "
            "duration=%.3fs finish=%s structured=%s model=%s images=%d%s", self.request_id,
            self.principal.user, self.endpoint, self.stream, status, prompt, completion, ttft,
            duration, finish, self.kind or "-", self.model.name, self.num_images, task)


async def compile_grammar(server: ServerState, model: ServedModel, params: SamplingParams,
                          request: Request) -> xgr.CompiledGrammar | None:
    """The compiled grammar of params.structured_outputs (None without one), compiled in a
    worker thread while the engine steps on. APIError 400 for a spec that does not compile,
    503 if the engine cannot serve; ClientGone if the client leaves meanwhile (nothing was
    queued, so nothing is left to free)."""
    if params.structured_outputs is None:
        return None
    try:
        return await until_disconnect(
            model.async_engine.compile_grammar(params.structured_outputs), request)
    except StructuredOutputError as exc:
        raise invalid_value(exc) from exc
    except EngineDeadError as exc:
        raise unavailable(str(exc), server.settings.retry_after_s) from exc


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

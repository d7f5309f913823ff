"""POST /v1/completions (the legacy text API; a batch of prompts is allowed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from officellm.app.admission.admission import Admission
from officellm.app.admission.auth import get_principal
from officellm.app.errors import invalid_value
from officellm.app.models.prompt import ChatPrompt
from officellm.app.models.served_model import ServedModel
from officellm.app.openai.answers import (
    ERROR_RESPONSES,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    Usage,
    error_response,
    sse_description,
)
from officellm.app.openai.logprobs import completion_logprobs, joined
from officellm.app.openai.protocol import CompletionRequest
from officellm.app.openai.sse import DONE, KEEPALIVE, SSEResponse, sse
from officellm.app.principal import Principal
from officellm.app.serving.generation import (
    Choice,
    Generation,
    RequestFailed,
    compile_grammar,
)
from officellm.app.serving.generation_pipeline import GenerationCall, Started, run_generation
from officellm.app.serving.heartbeats import with_heartbeats
from officellm.app.serving.state import ServerState, admitted_server
from officellm.engine import EngineDeadError, PromptLogprobs, SamplingParams

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/completions", response_model=Completion,
             responses=sse_description(CompletionChunk))
async def completions(body: CompletionRequest, request: Request,
                      principal: Principal = Depends(get_principal),
                      server: ServerState = Depends(admitted_server)) -> Response:
    """OpenAI's text completions, streaming or not, by the one path every generation takes;
    quota and concurrency apply (threads are a chat notion, so no thread limits here)."""
    try:
        constraint = body.output_constraint()  # response_format, structured_outputs, guided_*
        params = body.sampling_params(constraint.spec if constraint else None)
    except ValueError as exc:
        raise invalid_value(exc) from exc
    try:
        prompts = body.prompts()
    except ValueError as exc:
        raise invalid_value(exc, "prompt") from exc
    kind = constraint.kind if constraint else None
    call = GenerationCall("completions", f"cmpl-{uuid.uuid4().hex}", body.user, body.stream,
                          body.model, len(prompts) * params.n)
    return await run_generation(
        server, request, principal, call,
        lambda model: _CompletionInput(prompts, params, kind, model.name),
        lambda read: _CompletionAnswer(body, read))


@dataclass(frozen=True)
class _CompletionInput:
    """The prompts (text or token ids) and how to sample them."""

    prompts: list[str | list[int]]
    params: SamplingParams
    kind: str | None  # the output constraint's, for the structured-output counters
    model: str

    async def start(self, server: ServerState, model: ServedModel, request: Request,
                    admission: Admission, call: GenerationCall) -> Started:
        """See GenerationInput: each prompt as is, no template and no thread."""
        ids = [await model.prompts.completion(admission, p) for p in self.prompts]
        grammar = await compile_grammar(server, model, self.params, request)
        gen = Generation(server, model, call.request_id, ids, self.params, admission,
                         stream=call.stream, grammar=grammar, kind=self.kind)
        gen.start()
        return Started(gen)


@dataclass(frozen=True)
class _CompletionAnswer:
    """A completion or its chunks, each prompt echoed in front of its choices if asked."""

    body: CompletionRequest
    read: _CompletionInput

    def _echo(self, gen: Generation) -> list[str] | None:
        if not self.body.echo:
            return None
        return [_echo_text(gen.model, p, ids)
                for p, ids in zip(self.read.prompts, gen.prompt_token_ids, strict=True)]

    def notice(self, prompt: ChatPrompt) -> Response:
        # A thread policy's notice answers chats only: a completion has no thread.
        raise AssertionError("a completion is never answered by a thread policy's notice")

    def stream(self, gen: Generation, headers: dict[str, str] | None) -> Response:
        return SSEResponse(_stream(gen, self.body, self.read.model, self._echo(gen)),
                           on_close=gen.close, headers=headers)

    def whole(self, gen: Generation, choices: list[Choice],
              headers: dict[str, str] | None) -> Response:
        answer = _response(gen, choices, self.body, self.read.model, self._echo(gen))
        return JSONResponse(answer.model_dump(), headers=headers)


def _echo_text(model: ServedModel, prompt: str | list[int], ids: list[int]) -> str:
    return prompt if isinstance(prompt, str) else model.token_text.decode(ids)


def _logprobs(gen: Generation, c: Choice, body: CompletionRequest,
              offset: int) -> CompletionLogprobs | None:
    if c.output.logprobs is None or body.logprobs is None:
        return None
    return completion_logprobs(c.output.token_ids, c.output.logprobs, body.logprobs,
                               gen.model.token_text, offset)


def _prompt_logprobs(gen: Generation, prompt_index: int, entries: PromptLogprobs | None,
                     body: CompletionRequest) -> CompletionLogprobs | None:
    """An echoed prompt's tokens and logprobs (text offsets from 0), when asked for."""
    if entries is None or body.logprobs is None:
        return None
    return completion_logprobs(gen.prompt_token_ids[prompt_index], entries, body.logprobs,
                               gen.model.token_text, 0)


def _scored_finish(finish: str | None) -> str | None:
    """A prompt scored alone (max_tokens 0) ends by length, whatever ended the one token
    the engine sampled to score it; an abort stays one."""
    return "length" if finish in ("stop", "length") else finish


def _usage(gen: Generation, body: CompletionRequest) -> Usage:
    usage = gen.usage()
    if body.scores_prompt_only:  # the token sampled to score the prompt is not the answer's
        usage.update(completion_tokens=0, total_tokens=usage["prompt_tokens"])
    return Usage(**usage)


def _response(gen: Generation, choices: list[Choice], body: CompletionRequest, model: str,
              echo: list[str] | None) -> Completion:
    out = []
    for c in choices:
        prefix = echo[c.prompt_index] if echo else ""
        text, finish, stop_reason = c.output.text, c.output.finish_reason, c.output.stop_reason
        lps = _logprobs(gen, c, body, len(prefix))
        if body.scores_prompt_only:
            text, lps, finish, stop_reason = "", None, _scored_finish(finish), None
        if echo:
            prompt_lps = _prompt_logprobs(gen, c.prompt_index, c.prompt_logprobs, body)
            if prompt_lps is not None:
                lps = prompt_lps if lps is None else joined(prompt_lps, lps)
        out.append(CompletionChoice(index=c.index, text=prefix + text, logprobs=lps,
                                    finish_reason=finish, stop_reason=stop_reason))
    return Completion(id=gen.request_id, created=gen.created, model=model, choices=out,
                      usage=_usage(gen, body))


async def _stream(gen: Generation, body: CompletionRequest, model: str,
                  echo: list[str] | None) -> AsyncIterator[str]:
    include_usage = body.include_usage
    offsets = [0] * gen.num_choices  # characters sent so far, for logprobs' text_offset
    n = gen.params.n
    # An echo asked for with logprobs waits for its prompt's logprobs, which come with the
    # prompt's first output; it still goes before anything its choice generates.
    echo_waits = echo is not None and body.logprobs is not None
    echoed = [not echo_waits] * gen.num_choices
    prompt_entries: dict[int, PromptLogprobs] = {}

    def chunk(index: int, text: str, logprobs: CompletionLogprobs | None, finish: str | None,
              stop_reason: int | str | None = None) -> str:
        payload = CompletionChunk(
            id=gen.request_id, created=gen.created, model=model,
            choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                      finish_reason=finish, stop_reason=stop_reason)])
        if include_usage:
            payload.usage = None  # set, so it is sent (as OpenAI: null until the last chunk)
        return sse(payload)

    def echo_chunk(index: int, prompt_index: int) -> str:
        assert echo is not None
        text = echo[prompt_index]
        offsets[index] = len(text)
        return chunk(index, text, _prompt_logprobs(gen, prompt_index,
                                                   prompt_entries.get(prompt_index), body),
                     None)

    if echo and not echo_waits:
        for index in range(gen.num_choices):
            yield echo_chunk(index, index // n)
    try:
        async for step in with_heartbeats(gen.choices()):
            if step is None:  # a long prefill: say something, or the client may give up
                yield KEEPALIVE
                continue
            for c in step:
                if c.prompt_logprobs is not None:
                    prompt_entries[c.prompt_index] = c.prompt_logprobs
                if not echoed[c.index]:
                    echoed[c.index] = True
                    yield echo_chunk(c.index, c.prompt_index)
                o = c.output
                if body.scores_prompt_only:
                    if o.finish_reason:
                        yield chunk(c.index, "", None, _scored_finish(o.finish_reason))
                    continue
                if not (o.text or o.logprobs or o.finish_reason):
                    continue
                lps = _logprobs(gen, c, body, offsets[c.index])
                offsets[c.index] += len(o.text)
                yield chunk(c.index, o.text, lps, o.finish_reason, o.stop_reason)
    except (RequestFailed, EngineDeadError) as exc:
        # Headers are sent: the error travels as the last event, in OpenAI's shape.
        yield sse(error_response(gen.failure_error(exc)))
        return
    if include_usage:
        yield sse(CompletionChunk(id=gen.request_id, created=gen.created, model=model,
                                  choices=[], usage=_usage(gen, body)))
    yield DONE

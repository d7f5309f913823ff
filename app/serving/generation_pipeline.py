"""What every generation request does, whichever API it came by (/v1/chat/completions,
/v1/completions, /v1/responses, /v1/messages): the caller it runs as, the model it names, its
admission, that model loaded, its prompts (a chat's under its thread's length rules), its
grammar, its engine request, and the answer's three forms (a policy's notice, a stream, one
whole answer). One path, so every API counts, caps and meters alike; each route only reads its
body (GenerationInput) and words the answers in its API's shapes (Answer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response

from officellm.app.admission.admission import Admission
from officellm.app.admission.auth import get_caller
from officellm.app.chat.chat_formats import ChatPlan
from officellm.app.chat.image_input import ImageInputError
from officellm.app.chat.image_parts import ChatImages, load_chat_images
from officellm.app.errors import invalid_value
from officellm.app.models.prompt import INVALID, ChatPrompt, Message
from officellm.app.models.served_model import ServedModel
from officellm.app.policy import chat_thread, task_max_tokens
from officellm.app.principal import Principal
from officellm.app.serving.generation import Choice, ClientGone, Generation, compile_grammar
from officellm.app.serving.state import ServerState
from officellm.engine import SamplingParams

# How many of the oldest turns a thread policy's on_limit=truncate dropped.
TRUNCATED_HEADER = "X-OfficeLLM-Truncated"


@dataclass(frozen=True)
class Started:
    """An admitted request under way: its running generation, or (None) the notice its
    thread policy answers instead of the engine (on_limit=notify: `prompt` says it), and the
    answer's extra headers."""

    generation: Generation | None
    prompt: ChatPrompt | None = None
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class GenerationCall:
    """What a route tells the pipeline besides the body it read."""

    endpoint: str  # the API, as admission and the access log name it: "chat", "responses"
    request_id: str
    user: str | None  # the request's `user` field
    stream: bool
    model: str | None  # the request's `model` field
    n: int = 1  # engine sequences admission counts: choices asked for (x prompts)
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] | None = None


class GenerationInput(Protocol):
    """A request as its route read it from its body (a 400 already raised for what the body
    may not ask), for the served model: how it starts once admitted."""

    model: str  # the served name its answer reports

    async def start(self, server: ServerState, model: ServedModel, request: Request,
                    admission: Admission, call: GenerationCall) -> Started:
        """Render its prompts, compile its grammar and start the engine (or answer the
        thread policy's notice). Raises APIError for a refusal, ClientGone if the client
        leaves while its grammar compiles (nothing ran then)."""
        ...


async def start_chat(server: ServerState, model: ServedModel, request: Request,
                     admission: Admission,
                     messages: list[Message], plan: ChatPlan, params: SamplingParams, *,
                     request_id: str, stream: bool, user: str | None,
                     add_generation_prompt: bool = True,
                     template_kwargs: dict[str, Any] | None = None) -> Started:
    """Render and check the prompt of `messages` (as `plan` shapes them), compile the
    grammar, and start the engine on it. `user` is the request's `user` field.

    Raises APIError for a length rule's refusal (400) or an engine that cannot serve (503),
    and ClientGone if the client leaves while its grammar compiles (nothing ran then).
    """
    principal = admission.principal
    # Images first: a refusal (no vision, a bad image) costs nothing further, and from here
    # on the messages hold each image's content hash, never its bytes.
    messages, images = await load_images(server, model, principal, messages)
    # The client's id for the thread (X-Thread-Id, Open WebUI's chat id, else `user` unless
    # it names a person), else the opening messages; a front end's background task (a
    # title, tags) belongs to none.
    thread = chat_thread(principal.user_id, messages, request.headers,
                         None if principal.front_end is not None else user)
    prompt = await model.prompts.chat(admission, messages, thread, add_generation_prompt,
                                       {**(template_kwargs or {}), **plan.template_kwargs},
                                       images)
    turns = prompt.truncated_turns
    headers = {TRUNCATED_HEADER: str(turns)} if turns else None
    if prompt.decision.action == "notify":
        return Started(None, prompt, headers)  # the engine never runs: nothing to count
    assert prompt.token_ids is not None
    params = plan.sampling_params(params)
    if thread.task is not None:
        params = task_params(params, server.settings.task_max_tokens, model.default_max_tokens)
    grammar = await compile_grammar(server, model, params, request)
    gen = Generation(server, model, request_id, [prompt.token_ids], params, admission, stream=stream,
                     thread_key=thread.key, turns=prompt.turns, grammar=grammar, kind=plan.kind,
                     task=thread.task, multimodal=prompt.multimodal)
    gen.start()
    return Started(gen, prompt, headers)


async def load_images(server: ServerState, model: ServedModel, principal: Principal,
                      messages: list[Message]) -> tuple[list[Message], ChatImages | None]:
    """The messages with their images loaded (app/chat/image_parts.py); APIError 400 for an
    image the model or the server cannot take."""
    assert model.loaded is not None  # loaded before its messages are read
    try:
        return await load_chat_images(messages, server.settings.image_limits,
                                      model.loaded.vision, model.name)
    except ImageInputError as exc:
        server.refusals.server_limit(principal, INVALID)
        raise invalid_value(exc, "messages") from exc


def task_params(params: SamplingParams, cap: int | None,
                default: int | None = None) -> SamplingParams:
    """A background task's sampling parameters: max_tokens under --task-max-tokens (`cap`;
    `default`: the model's max_tokens for requests that send none; app/policy/
    background_tasks.py's rule), min_tokens no more than that."""
    max_tokens = task_max_tokens(params.max_tokens, cap, default)
    if max_tokens == params.max_tokens:
        return params
    assert max_tokens is not None  # a cap only ever lowers or sets it
    return replace(params, max_tokens=max_tokens, min_tokens=min(params.min_tokens, max_tokens))


@dataclass(frozen=True)
class ChatInput:
    """A chat-shaped request as its route read it: the messages, how the served model's
    formats shape them, the sampling parameters and the served model's name for the answer."""

    messages: list[Message]
    plan: ChatPlan
    params: SamplingParams
    model: str
    max_model_len: int = 0  # the served model's context window

    async def start(self, server: ServerState, model: ServedModel, request: Request,
                    admission: Admission, call: GenerationCall) -> Started:
        """See GenerationInput: the chat's thread, its prompt under every length rule."""
        return await start_chat(server, model, request, admission, self.messages, self.plan,
                                self.params, request_id=call.request_id, stream=call.stream,
                                user=call.user, add_generation_prompt=call.add_generation_prompt,
                                template_kwargs=call.template_kwargs)


In = TypeVar("In", bound=GenerationInput)


class Answer(Protocol):
    """How a route words the outcome of its request, in its API's shapes."""

    def notice(self, prompt: ChatPrompt) -> Response:
        """on_limit=notify: the policy's sentence as a normal answer (the engine never ran)."""
        ...

    def stream(self, gen: Generation, headers: dict[str, str] | None) -> Response:
        """The streamed answer (an SSE response that closes `gen` however it ends)."""
        ...

    def whole(self, gen: Generation, choices: list[Choice],
              headers: dict[str, str] | None) -> Response:
        """The answer once every choice has finished."""
        ...


async def run_generation(server: ServerState, request: Request, principal: Principal,
                         call: GenerationCall, read: Callable[[ServedModel], In],
                         answer: Callable[[In], Answer]) -> Response:
    """Run one request to its answer: the caller it runs as (a front-end key's person), the
    model it names, its admission, that model loaded, its body as the model reads it
    (`read`: 400s before the engine is asked anything), its start and `answer`'s notice,
    stream or whole answer. 499 when the client left before its answer (while its grammar
    compiled, nothing ran)."""
    # A front-end key's request runs as the person it is for (docs/design.md §5).
    principal = await get_caller(request, principal, call.user)
    model = await server.models.resolve(call.model)
    async with server.admission.admit(principal, call.endpoint, call.n,
                                      model.name or None) as admission:
        await server.load_for(model, admission)
        body = read(model)
        try:
            started = await body.start(server, model, request, admission, call)
        except ClientGone:
            return Response(status_code=499)  # left while its grammar compiled: nothing ran
        reply = answer(body)
        gen = started.generation
        if gen is None:
            assert started.prompt is not None
            return reply.notice(started.prompt)
        if call.stream:
            return admission.hold(reply.stream(gen, started.headers))
        choices = await gen.complete(request)
        if choices is None:
            return Response(status_code=499)  # nobody is listening; nginx's "client closed"
        return reply.whole(gen, choices, started.headers)

"""POST /tokenize and POST /detokenize: vLLM's routes to the served model's tokenizer.

They authenticate like the OpenAI routes (the same key, 401 and 403), but take no admission:
tokenizing is cheap (a worker thread, never the engine) and clients such as Open WebUI and IDE
plugins call it to count a prompt's tokens before sending it, so it spends no daily quota and
holds none of the user's concurrent-request slots. A chat is tokenized by the same
PromptRenderer.render call the chat completions route makes, so `count` is the prompt_tokens
that chat would use (before any truncation its user's thread policy applies). The text is
neither logged nor stored: the access line has sizes only.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.auth import get_caller, get_principal
from officellm.app.errors import APIError, invalid_value
from officellm.app.models.prompt import PromptRenderer
from officellm.app.models.served_model import ServedModel
from officellm.app.openai.answers import ERROR_RESPONSES, DetokenizeResponse, TokenizeResponse
from officellm.app.openai.protocol import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeRequest,
)
from officellm.app.principal import Principal
from officellm.app.serving.generation_pipeline import load_images
from officellm.app.serving.state import ServerState, admitted_server

access_log = logging.getLogger("officellm.access")

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request,
                   principal: Principal = Depends(get_principal),
                   server: ServerState = Depends(admitted_server)) -> TokenizeResponse:
    """A text's or a chat's token ids, as the completions or chat completions route would send
    them to the engine; `token_strs` with `return_token_strs`."""
    t0 = time.monotonic()
    # Through a front-end key, the person it speaks for: refused if the admin disabled them.
    principal = await get_caller(request, principal, None)
    async with server.models.using(body.model) as model:
        # Shaped as the chat route shapes a request without tools (earlier turns included).
        ids, strs = await _tokenize(server, model, principal, body)
        assert model.loaded is not None  # using(): loaded
        max_model_len = model.loaded.max_model_len
    _log(principal, "tokenize", len(ids), t0)
    return TokenizeResponse(count=len(ids), max_model_len=max_model_len, tokens=ids,
                            token_strs=strs)


async def _tokenize(server: ServerState, model: ServedModel, principal: Principal,
                    body: TokenizeRequest) -> tuple[list[int], list[str] | None]:
    """The request's token ids (a chat's messages as the chat route shapes a request without
    tools, each image's tokens included) and, with return_token_strs, their strings."""
    renderer = model.prompts.renderer
    if isinstance(body, TokenizeChatRequest):
        plan = model.chat_formats.plan(None, None)
        try:
            messages = plan.messages([m.to_template_dict() for m in body.messages])
        except ValueError as exc:
            raise invalid_value(exc, "messages") from exc
        messages, images = await load_images(server, model, principal, messages)
        try:
            ids, _ = await run_in_threadpool(renderer.render_chat, messages,
                                             body.add_generation_prompt,
                                             body.chat_template_kwargs or {}, images)
            if body.add_special_tokens:
                ids = await run_in_threadpool(renderer.with_special_tokens, ids)
        except ValueError as exc:
            raise invalid_value(exc, "messages") from exc
    else:
        assert isinstance(body, TokenizeCompletionRequest)
        ids = await run_in_threadpool(renderer.encode, body.prompt, body.add_special_tokens)
    strs = await run_in_threadpool(renderer.token_strs, ids) if body.return_token_strs else None
    return ids, strs


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request,
                     principal: Principal = Depends(get_principal),
                     server: ServerState = Depends(admitted_server)) -> DetokenizeResponse:
    """The text of token ids, special tokens included; 400 naming `tokens` for an id outside
    the vocabulary."""
    t0 = time.monotonic()
    principal = await get_caller(request, principal, None)
    async with server.models.using(body.model) as model:
        renderer = model.prompts.renderer
        _check_vocabulary(renderer, body.tokens)
        text = await run_in_threadpool(renderer.decode, body.tokens)
    _log(principal, "detokenize", len(body.tokens), t0)
    return DetokenizeResponse(prompt=text)


def _check_vocabulary(renderer: PromptRenderer, token_ids: list[int]) -> None:
    # The tokenizer would decode an unknown id as nothing, and a negative one not at all.
    size = renderer.vocab_size
    bad = next((t for t in token_ids if not 0 <= t < size), None)
    if bad is not None:
        raise APIError(400, f"Token id {bad} is outside the vocabulary: token ids must be in "
                            f"[0, {size}).", param="tokens")


def _log(principal: Principal, endpoint: str, tokens: int, t0: float) -> None:
    # Never the text: only its size, like a generation's access line.
    access_log.info("%s user=%s status=200 tokens=%d duration=%.3fs", endpoint, principal.user,
                    tokens, time.monotonic() - t0)

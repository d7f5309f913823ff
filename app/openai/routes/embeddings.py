"""POST /v1/embeddings: OpenAI's embeddings, from the embedding model (--embedding-model);
the same auth, per-user concurrency and daily quota as the other routes (an input's tokens
count toward max_tokens_per_day)."""

from __future__ import annotations

import logging
import time
import uuid

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.auth import get_caller, get_principal
from officellm.app.errors import APIError, unavailable
from officellm.app.openai.answers import ERROR_RESPONSES
from officellm.app.openai.embeddings_protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    encode_vector,
)
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, get_server
from officellm.engine import AsyncEmbedder, EncoderInfo, EngineDeadError

router = APIRouter(responses=ERROR_RESPONSES)
access_log = logging.getLogger("officellm.access")


def _check_dimensions(name: str, info: EncoderInfo, dimensions: int | None) -> int | None:
    """`dimensions` if the model makes vectors that long (None: its own length)."""
    if dimensions is None or dimensions == info.dimensions:
        return None
    if dimensions > info.dimensions:
        raise APIError(400, f"dimensions is {dimensions}, but the model `{name}` makes "
                       f"{info.dimensions}-dimensional vectors.", param="dimensions")
    if info.matryoshka_dimensions is None or dimensions not in info.matryoshka_dimensions:
        trained = ("" if info.matryoshka_dimensions is None else
                   " (it was trained for " + ", ".join(map(str, info.matryoshka_dimensions))
                   + ")")
        raise APIError(400, f"The model `{name}` makes {info.dimensions}-dimensional vectors "
                       f"and was not trained for {dimensions}{trained}; leave dimensions out "
                       "or give one it was trained for.", param="dimensions")
    return dimensions


def _token_ids(name: str, embedder: AsyncEmbedder, body: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids, within the model's limit (cut to truncate_prompt_tokens if
    given, else a 400 naming the input that is too long)."""
    info = embedder.info
    cut = body.truncate_prompt_tokens
    if cut == -1:
        cut = info.max_input_tokens
    if cut is not None and cut > info.max_input_tokens:
        raise APIError(400, f"truncate_prompt_tokens is {cut}, but the model `{name}` reads at "
                       f"most {info.max_input_tokens} tokens.", param="truncate_prompt_tokens")
    out = []
    for i, item in enumerate(body.inputs()):
        if isinstance(item, str):
            ids = embedder.tokenize(item, cut)
        else:
            if max(item) >= info.vocab_size:
                raise APIError(400, f"Input {i} has the token id {max(item)}; the model "
                               f"`{name}` knows ids 0 to {info.vocab_size - 1}.", param="input")
            ids = item[:cut] if cut is not None else item
        if len(ids) > info.max_input_tokens:
            raise APIError(400, f"Input {i} is {len(ids)} tokens; the model `{name}` reads at "
                           f"most {info.max_input_tokens}. Shorten it, or send "
                           "truncate_prompt_tokens to cut it.", param="input")
        out.append(ids)
    return out


@router.post("/v1/embeddings", response_model=EmbeddingResponse)
async def embeddings(body: EmbeddingRequest, request: Request,
                     principal: Principal = Depends(get_principal),
                     server: ServerState = Depends(get_server)) -> EmbeddingResponse:
    """One vector per input, in order; inputs of concurrent requests are encoded together."""
    principal = await get_caller(request, principal, body.user)
    served = await server.models.resolve_embedder(body.model)
    name, embedder = served.name, served.embedder
    server.admission.refuse_if_draining()
    t0 = time.monotonic()
    async with server.admission.admit(principal, "embeddings", 0, name):
        # Leased from its load to its vectors: idle sleep never frees it in between.
        embedder.leases += 1
        try:
            await served.wake(server.settings.retry_after_s)
            dimensions = _check_dimensions(name, embedder.info, body.dimensions)
            ids = await run_in_threadpool(_token_ids, name, embedder, body)
            tokens = sum(len(i) for i in ids)
            vectors = await embedder.embed(ids, dimensions)
        except EngineDeadError as exc:
            raise unavailable(str(exc), server.settings.retry_after_s) from exc
        finally:
            embedder.leases -= 1
            served.touch()
    busy = time.monotonic() - t0
    server.accounts.record_embeddings(principal.user_id, name, tokens, busy)
    server.metrics.record_embeddings(name, principal.user, len(ids), tokens)
    access_log.info("embd-%s user=%s embeddings status=200 inputs=%d prompt_tokens=%d "
                    "duration=%.3fs", uuid.uuid4().hex[:12], principal.user, len(ids), tokens,
                    busy)
    return EmbeddingResponse(
        data=[EmbeddingData(index=i, embedding=encode_vector(v, body.encoding_format))
              for i, v in enumerate(vectors)],
        model=name, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))

"""Reranking: `POST /v1/rerank` and `/rerank` (Jina's and vLLM's shape), `/v2/rerank`
(Cohere's v2) and vLLM's `/score` and `/v1/score`, from a rerank model (a registry entry of
kind rerank); the same auth, admission, per-user policy (its models, its daily quota: the
pairs' tokens count) and usage as embeddings."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request

from officellm.app.admission.auth import get_caller, get_principal
from officellm.app.errors import APIError, unavailable
from officellm.app.openai.answers import ERROR_RESPONSES
from officellm.app.openai.rerank_protocol import (
    CohereRerankResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    ScoreUsage,
)
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, get_server
from officellm.engine import EngineDeadError

router = APIRouter(responses=ERROR_RESPONSES)
access_log = logging.getLogger("officellm.access")


@dataclass(frozen=True)
class Scores:
    """A request's scores, in its pairs' order, and the model and tokens that made them."""

    model: str
    scores: list[float]
    tokens: int


async def _score(request: Request, principal: Principal, server: ServerState,
                 model: str | None, user: str | None, pairs: list[tuple[str, str]]) -> Scores:
    """Score the (query, document) pairs on the rerank model `model` names, admitted and
    counted like an embeddings request: each query's documents go to the reranker
    together, and concurrent requests' pairs share its batches."""
    principal = await get_caller(request, principal, user)
    served = await server.models.resolve_reranker(model)
    name, reranker = served.name, served.reranker
    server.admission.refuse_if_draining()
    by_query: dict[str, list[int]] = {}
    for i, (query, _) in enumerate(pairs):
        by_query.setdefault(query, []).append(i)
    t0 = time.monotonic()
    async with server.admission.admit(principal, "rerank", 0, name):
        # Leased from its load to its scores: idle sleep never frees it in between.
        reranker.leases += 1
        try:
            await served.wake(server.settings.retry_after_s)
            groups = await asyncio.gather(*[
                reranker.score(query, [pairs[i][1] for i in indexes])
                for query, indexes in by_query.items()])
        except EngineDeadError as exc:
            raise unavailable(str(exc), server.settings.retry_after_s) from exc
        except RuntimeError as exc:  # the batch failed in the model (logged there)
            raise APIError(500, str(exc), code="scoring_failed") from exc
        finally:
            reranker.leases -= 1
            served.touch()
    scored = [None] * len(pairs)
    for indexes, group in zip(by_query.values(), groups, strict=True):
        for i, pair in zip(indexes, group, strict=True):
            scored[i] = pair
    tokens = sum(s.tokens for s in scored)
    busy = time.monotonic() - t0
    server.accounts.record_rerank(principal.user_id, name, tokens, busy)
    server.metrics.record_rerank(name, principal.user, len(pairs), tokens)
    access_log.info("rerank-%s user=%s rerank status=200 documents=%d prompt_tokens=%d "
                    "duration=%.3fs", uuid.uuid4().hex[:12], principal.user, len(pairs),
                    tokens, busy)
    return Scores(name, [s.score for s in scored], tokens)


def _ranked(body: RerankRequest, scores: list[float], echo: bool) -> list[RerankResult]:
    """The results most relevant first (ties in the documents' order), the top_n of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if body.top_n:
        order = order[:body.top_n]
    texts = body.texts()
    results = []
    for i in order:
        result = RerankResult(index=i, relevance_score=scores[i])
        if echo:
            result.document = RerankDocument(text=texts[i])
        results.append(result)
    return results


async def _rerank(body: RerankRequest, request: Request, principal: Principal,
                  server: ServerState) -> tuple[Scores, list[tuple[str, str]]]:
    pairs = [(body.query, text) for text in body.texts()]
    return await _score(request, principal, server, body.model, body.user, pairs), pairs


@router.post("/v1/rerank", response_model=RerankResponse)
@router.post("/rerank", response_model=RerankResponse)
async def rerank(body: RerankRequest, request: Request,
                 principal: Principal = Depends(get_principal),
                 server: ServerState = Depends(get_server)) -> RerankResponse:
    """Jina's and vLLM's rerank: the documents most relevant first, echoed unless
    return_documents is false."""
    scores, _ = await _rerank(body, request, principal, server)
    echo = body.return_documents is not False
    return RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=scores.model,
                          results=_ranked(body, scores.scores, echo),
                          usage=RerankUsage(prompt_tokens=scores.tokens,
                                            total_tokens=scores.tokens))


@router.post("/v2/rerank", response_model=CohereRerankResponse)
async def rerank_v2(body: RerankRequest, request: Request,
                    principal: Principal = Depends(get_principal),
                    server: ServerState = Depends(get_server)) -> CohereRerankResponse:
    """Cohere's v2 rerank: the documents most relevant first, with the billed units; the
    documents echoed only when return_documents is true."""
    scores, pairs = await _rerank(body, request, principal, server)
    return CohereRerankResponse(
        id=str(uuid.uuid4()), results=_ranked(body, scores.scores, bool(body.return_documents)),
        meta=CohereRerankResponse.meta_for(len(pairs), scores.tokens))


@router.post("/score", response_model=ScoreResponse)
@router.post("/v1/score", response_model=ScoreResponse)
async def score(body: ScoreRequest, request: Request,
                principal: Principal = Depends(get_principal),
                server: ServerState = Depends(get_server)) -> ScoreResponse:
    """vLLM's score: text_1 against each text_2, or pairwise; one score per pair, in order."""
    try:
        pairs = body.pairs()
    except ValueError as exc:
        raise APIError(400, str(exc), param="text_2") from exc
    scores = await _score(request, principal, server, body.model, body.user, pairs)
    return ScoreResponse(id=f"score-{uuid.uuid4().hex}", created=int(time.time()),
                         model=scores.model,
                         data=[ScoreData(index=i, score=s) for i, s in enumerate(scores.scores)],
                         usage=ScoreUsage(prompt_tokens=scores.tokens,
                                          total_tokens=scores.tokens))

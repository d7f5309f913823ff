"""GET /health (no auth, for load balancers and the console) and GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.auth import get_principal
from officellm.app.errors import APIError
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, get_server

router = APIRouter()


@router.get("/health")
async def health(server: ServerState = Depends(get_server)) -> JSONResponse:
    """200 when ready (the embedding model too, if there is one), or asleep (the next
    request wakes it); 503 with Retry-After while loading, shutting down, or after a
    failure."""
    default = server.default_model
    try:
        if default.state != "sleeping":
            server.check_ready()
        server.check_embedders_ready()
    except APIError as exc:
        return exc.response()
    return JSONResponse({"status": "ok", "model": server.model_name, "state": default.state,
                         "models": {m.name: m.state for m in server.models.models if m.name}
                         | {e.name: e.state for e in server.models.embedders}
                         | {t.name: t.state for t in server.models.transcribers}
                         | {r.name: r.state for r in server.models.rerankers}})


@router.get("/metrics")
async def metrics(principal: Principal = Depends(get_principal),
                  server: ServerState = Depends(get_server)) -> Response:
    """Prometheus text format, from this app's own registry (on a worker thread: the
    active-threads gauge reads the database)."""
    body = await run_in_threadpool(generate_latest, server.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

"""GET /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from app.admission.auth import Principal, get_principal
from app.serving.state import ServerState, admitted_server

router = APIRouter()


@router.get("/v1/models")
async def list_models(principal: Principal = Depends(get_principal),
                      server: ServerState = Depends(admitted_server)) -> dict[str, Any]:
    """The served model under each of its names, in OpenAI's list shape."""
    engine = server.async_engine.engine
    max_len = engine.max_model_len if engine is not None else None
    root = str(engine.model_dir) if engine is not None else None
    data = [{"id": name, "object": "model", "created": server.created, "owned_by": "officellm",
             "root": root, "max_model_len": max_len} for name in server.served_model_names]
    return {"object": "list", "data": data}

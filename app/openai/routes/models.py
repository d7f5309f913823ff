"""GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from officellm.app.admission.auth import get_principal
from officellm.app.openai.answers import ERROR_RESPONSES, ModelCard, ModelList
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, admitted_server

router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/v1/models")
async def list_models(principal: Principal = Depends(get_principal),
                      server: ServerState = Depends(admitted_server)) -> ModelList:
    """The served model under each of its names, then the embedding model (once loaded), in
    OpenAI's list shape."""
    engine = server.async_engine.engine
    max_len = engine.max_model_len if engine is not None else None
    root = str(engine.model_dir) if engine is not None else None
    cards = [ModelCard(id=name, created=server.created, root=root, max_model_len=max_len)
             for name in server.served_model_names]
    embedder = server.embedder
    if embedder is not None and embedder.is_ready and server.embedding_model_name:
        cards.append(ModelCard(id=server.embedding_model_name, created=server.created,
                               root=str(embedder.model_dir),
                               max_model_len=embedder.info.max_input_tokens))
    return ModelList(data=cards)

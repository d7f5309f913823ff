"""GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from officellm.app.admission.auth import get_principal
from officellm.app.openai.answers import ERROR_RESPONSES, ModelCard, ModelList
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, get_server

router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/v1/models")
async def list_models(principal: Principal = Depends(get_principal),
                      server: ServerState = Depends(get_server)) -> ModelList:
    """The served model under each of its names, then the embedding model (once loaded), in
    OpenAI's list shape, each with its state. Listing never wakes a sleeping model (front
    ends poll this)."""
    loaded = server.loaded
    if loaded is None:  # not loaded yet (or it failed): 503, saying which
        server.check_ready()
    assert loaded is not None
    server.admission.refuse_if_draining()
    cards = [ModelCard(id=name, created=server.created, root=loaded.model_dir,
                       max_model_len=loaded.max_model_len, state=server.model_state)
             for name in server.served_model_names]
    embedder = server.embedder
    if embedder is not None and embedder.is_ready and server.embedding_model_name:
        cards.append(ModelCard(id=server.embedding_model_name, created=server.created,
                               root=str(embedder.model_dir),
                               max_model_len=embedder.info.max_input_tokens, state="ready"))
    return ModelList(data=cards)

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
    """Every served model under each of its names (the registry's order, the default first),
    then the embedding, speech-to-text and rerank models, in OpenAI's list shape, each with
    its state.
    Listing never loads a model (front ends poll this), and answers while the default model
    loads at start (`"state": "loading"`, under the name it will have): a front end that
    polls it during a start shows the model coming, not an error."""
    server.admission.refuse_if_draining()
    await server.models.registry.refresh()
    cards = []
    for model in server.models.models:
        loaded = model.loaded
        root = loaded.model_dir if loaded is not None else model.entry.source
        max_len = (loaded.max_model_len if loaded is not None
                   else model.entry.options.get("max_model_len"))
        cards += [ModelCard(id=name, created=server.created, root=root, max_model_len=max_len,
                            state=model.state) for name in model.names]
    for served in server.models.embedders:
        embedder = served.embedder
        ready = embedder.is_ready
        cards.append(ModelCard(id=served.name, created=server.created,
                               root=str(embedder.model_dir) if ready else served.entry.source,
                               max_model_len=embedder.info.max_input_tokens if ready else None,
                               state=served.state))
    cards += [ModelCard(id=spoken.name, created=server.created, root=spoken.entry.source,
                        max_model_len=None, state=spoken.state)
              for spoken in server.models.transcribers]
    for served in server.models.rerankers:
        reranker = served.reranker
        ready = reranker.is_ready
        cards.append(ModelCard(id=served.name, created=server.created,
                               root=str(served.entry.source),
                               max_model_len=reranker.info.max_input_tokens if ready else None,
                               state=served.state))
    return ModelList(data=cards)

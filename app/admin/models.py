"""/admin/models: the model registry and what each model is doing (docs/admin_api.md): list,
add (a path, or a Hugging Face Hub repo the server downloads), change, remove, load, unload.

The registry lives in the database (every replica sees it); loading is this replica's."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from officellm.app.admin.access import admin_actor
from officellm.app.admin.errors import answered_errors
from officellm.app.db import admin_changes
from officellm.app.db.audit import record_change
from officellm.app.db.registered_models import list_entries
from officellm.app.errors import APIError
from officellm.app.models.served import UNLOADED
from officellm.app.models.served_embedder import ServedEmbedder
from officellm.app.models.served_model import ServedModel
from officellm.app.models.served_reranker import ServedReranker
from officellm.app.models.served_transcriber import ServedTranscriber
from officellm.app.registry.downloads import Download
from officellm.app.registry.entry import GENERATE, ModelEntry
from officellm.app.registry.hub_pull import pull, pulled_dir
from officellm.app.serving.state import ServerState
from officellm.engine import check_architecture

logger = logging.getLogger("officellm.server")
router = APIRouter()


class DownloadView(BaseModel):
    bytes_done: int
    bytes_total: int | None


class ModelRow(BaseModel):
    """One registered model and its state on this replica."""

    name: str
    source: str
    kind: str = Field(description="generate, embed, transcribe or rerank.")
    pinned: bool = Field(description="Loaded at start, never unloaded to make room.")
    aliases: list[str]
    sleep_idle_seconds: float | None
    options: dict[str, Any]
    hub_repo: str | None
    state: str = Field(description="unloaded, loading, ready, sleeping, failed, stopped or "
                                   "downloading.")
    memory_bytes: int | None = Field(description="Planned, against the memory budget: weights "
                                                 "plus KV pool, plus the KV tiers' RAM on the "
                                                 "CPU (null until estimated).")
    weight_bytes: int | None
    kv_cache_bytes: int | None
    kv_tier_ram_bytes: int | None = Field(None, description="The host RAM of its KV tiers "
                                                            "below the pool: the host tier, "
                                                            "the disk tier's buffers "
                                                            "(docs/kv_tiers.md).")
    last_used: str | None = Field(description="ISO 8601, UTC; null if never used.")
    fits: bool | None = Field(description="Its planned memory is within the budget (null "
                                          "until estimated).")
    error: str | None = Field(description="Why its last load or download failed.")
    requests_running: int
    kv_cache_usage: float | None
    engine_pid: int | None = Field(None, description="The process id of its engine process "
                                                     "while one runs (null in-process, or "
                                                     "out of memory).")
    download: DownloadView | None
    default: bool = Field(description="The command line's model: requests naming no model "
                                      "get it.")


class ModelsView(BaseModel):
    budget_bytes: int | None = Field(description="--memory-budget (or its default).")
    used_bytes: int = Field(description="The planned memory of the models in memory.")
    models: list[ModelRow]


class NewModel(BaseModel):
    name: str
    source: str | None = Field(None, description="A model directory or .gguf on the server.")
    hub_repo: str | None = Field(None, description="A Hugging Face Hub repo id to download "
                                                   "(instead of `source`).")
    kind: str = GENERATE
    pinned: bool = False
    aliases: list[str] = Field(default_factory=list)
    sleep_idle_seconds: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class ModelChange(BaseModel):
    pinned: bool | None = None
    sleep_idle_seconds: float | None = None
    aliases: list[str] | None = None
    options: dict[str, Any] | None = None


def _pulls(request: Request) -> dict[str, Download]:
    return _server(request).downloads.by_name


def _server(request: Request) -> ServerState:
    return request.app.state.server


def _row(server: ServerState, entry: ModelEntry, model: ServedModel | None = None,
         embedder: ServedEmbedder | ServedTranscriber | ServedReranker | None = None,
         default: bool = False) -> ModelRow:
    # `embedder`: a model beside the generate ones (an embedder, transcriber or reranker).
    stats = model.async_engine.stats() if model is not None and model.in_memory else None
    footprint = (model.footprint if model is not None else
                 embedder.footprint if isinstance(embedder, ServedTranscriber) else None)
    budget = server.models.budget_bytes
    state, error, last_used = "unloaded", None, None
    if model is not None:
        state, last_used = model.state, model.last_used_at
        error = model.async_engine.error if state == "failed" else None
    elif embedder is not None:
        state, last_used = embedder.state, embedder.last_used_at
        error = embedder.lifecycle.error if state == "failed" else None
    return ModelRow(
        **{k: v for k, v in entry.to_dict().items() if k != "name"},
        name=model.name if model is not None and model.name else entry.name,
        state=state,
        memory_bytes=footprint.total_bytes if footprint else None,
        weight_bytes=footprint.weight_bytes if footprint else None,
        kv_cache_bytes=footprint.kv_cache_bytes if footprint else None,
        kv_tier_ram_bytes=footprint.tier_ram_bytes if footprint else None,
        last_used=last_used.isoformat() if last_used is not None else None,
        fits=(None if footprint is None else
              budget is None or footprint.total_bytes <= budget),
        error=error,
        requests_running=(model.leases if model is not None else
                          embedder.leases if embedder is not None else 0),
        kv_cache_usage=stats.kv_cache_usage if stats is not None else None,
        engine_pid=model.async_engine.engine_pid if model is not None else None,
        download=None, default=default)


def _rows(server: ServerState, entries: list[ModelEntry],
          pulls: dict[str, Download]) -> list[ModelRow]:
    pool = server.models
    default = server.default_model
    rows = [_row(server, replace(default.entry, name=default.name or default.entry.source),
                 default, default=True)]
    rows += [_row(server, e.entry, embedder=e) for e in pool.embedders if e.command_line]
    for entry in entries:
        rows.append(_row(server, entry, pool.find(entry.name) if entry.kind == GENERATE
                         else None,
                         pool.find_embedder(entry.name) or pool.find_transcriber(entry.name)
                         or pool.find_reranker(entry.name)))
    for pulling in pulls.values():
        row = _row(server, pulling.entry)
        rows.append(row.model_copy(update={
            "state": "failed" if pulling.error else "downloading", "error": pulling.error,
            "download": DownloadView(bytes_done=pulling.bytes_done,
                                     bytes_total=pulling.bytes_total)}))
    return rows


def _read_entries(server: ServerState) -> list[ModelEntry]:
    with server.accounts.db.session() as session:
        return list_entries(session)


@router.get("/models")
async def get_models(request: Request) -> ModelsView:
    """Every model: the command line's (the default), the embedding model, the registry's,
    and those still downloading; with planned memory (estimated in the background)."""
    server = _server(request)
    entries = await run_in_threadpool(_read_entries, server)
    server.models.registry.apply(entries)
    server.models.estimate_in_background()
    return ModelsView(budget_bytes=server.models.budget_bytes,
                      used_bytes=server.models.used_bytes,
                      models=_rows(server, entries, _pulls(request)))


def _find_row(server: ServerState, request: Request, name: str,
              entries: list[ModelEntry]) -> ModelRow:
    for row in _rows(server, entries, _pulls(request)):
        if row.name == name:
            return row
    raise APIError(404, f"No model `{name}` is registered.", param="name", code="not_found")


@router.post("/models", status_code=201)
async def post_model(body: NewModel, request: Request) -> ModelRow:
    """Register a model: a path on the server (`source`), or a Hub repo the server
    downloads first (`hub_repo`; the row reads downloading, with progress, until done)."""
    server = _server(request)
    if (body.source is None) == (body.hub_repo is None):
        raise APIError(400, "Give either source (a model directory or .gguf on the server) or "
                            "hub_repo (a Hugging Face Hub repo id to download).", param="source")
    entry = ModelEntry(name=body.name, source=body.source or str(pulled_dir(body.hub_repo or "")),
                       kind=body.kind, pinned=body.pinned, aliases=tuple(body.aliases),
                       sleep_idle_seconds=body.sleep_idle_seconds, options=dict(body.options),
                       hub_repo=body.hub_repo)
    with answered_errors():
        entry.check()
    _check_new_name(server, request, entry.name)
    actor = admin_actor(request)
    if body.hub_repo is not None:
        asyncio.ensure_future(_download(server, server.downloads.start(entry), actor))
        return _find_row(server, request, entry.name, [])
    await run_in_threadpool(_store, server, entry, actor)
    entries = await run_in_threadpool(_read_entries, server)
    server.models.registry.apply(entries)
    server.models.estimate_in_background()
    return _find_row(server, request, entry.name, entries)


def _check_new_name(server: ServerState, request: Request, name: str) -> None:
    taken = {server.default_model.name, *_pulls(request),
             *(e.name for e in server.models.embedders if e.command_line)}
    if name in taken:
        raise APIError(409, f"A model named `{name}` is already served.", param="name",
                       code="already_exists")


def _store(server: ServerState, entry: ModelEntry, actor: str) -> None:
    with answered_errors("name"), server.accounts.db.transaction() as session:
        admin_changes.add_model(session, actor, entry)


async def _download(server: ServerState, download: Download, actor: str) -> None:
    """Download the entry's Hub repo, then register it (a failed download stays listed as
    failed, with its reason, until it is removed); the audit log's model.add row is written
    then, as `actor`'s."""
    entry = download.entry
    try:
        assert entry.hub_repo is not None
        check = check_architecture if entry.kind == GENERATE else None
        source = await asyncio.to_thread(pull, entry.hub_repo, pulled_dir(entry.hub_repo),
                                         None, download.report, check_config=check)
        await asyncio.to_thread(_store, server, replace(entry, source=str(source)), actor)
    except Exception as exc:  # the row says why; the server goes on
        download.error = f"{type(exc).__name__}: {exc}"
        logger.warning("Downloading %s for `%s` failed: %s", entry.hub_repo, entry.name,
                       download.error)
        return
    server.downloads.finish(entry.name)
    server.models.registry.apply(await asyncio.to_thread(_read_entries, server))
    logger.info("Downloaded %s: the model `%s` is registered", entry.hub_repo, entry.name)


@router.patch("/models/{name}")
async def patch_model(name: str, body: ModelChange, request: Request) -> ModelRow:
    """Pin or unpin a model, or change its idle time, aliases or serve options (options
    apply from its next load)."""
    server = _server(request)
    changes = body.model_dump(exclude_unset=True)
    # Only the idle time has a null (the server's --sleep-idle-seconds); for the others an
    # absent field keeps the value, so an explicit null is a mistake worth saying.
    nulls = [k for k, v in changes.items() if v is None and k != "sleep_idle_seconds"]
    if nulls:
        raise APIError(400, f"{nulls[0]} cannot be null; leave it out to keep its value.",
                       param=nulls[0])
    if "aliases" in changes:
        changes["aliases"] = tuple(changes["aliases"])

    actor = admin_actor(request)

    def change() -> ModelEntry | None:
        with answered_errors(), server.accounts.db.transaction() as session:
            return admin_changes.change_model(session, actor, name, **changes)

    if await run_in_threadpool(change) is None:
        raise _not_registered(server, name)
    entries = await run_in_threadpool(_read_entries, server)
    server.models.registry.apply(entries)
    return _find_row(server, request, name, entries)


def _command_line(server: ServerState, name: str) -> bool:
    """Whether `name` is served from `officellm serve`'s command line, not the registry."""
    return name == server.default_model.name or any(
        e.name == name and e.command_line for e in server.models.embedders)


def _not_registered(server: ServerState, name: str) -> APIError:
    if _command_line(server, name):
        return APIError(409, f"The model `{name}` is served from the command line, not the "
                             "registry: change it with `officellm serve`'s flags.",
                        param="name", code="not_registered")
    return APIError(404, f"No model `{name}` is registered.", param="name", code="not_found")


@router.delete("/models/{name}", status_code=204)
async def delete_model(name: str, request: Request) -> Response:
    """Remove a model from the registry (unloading it; 409 while requests use it)."""
    server = _server(request)
    pulls = _pulls(request)
    actor = admin_actor(request)
    if name in pulls and pulls[name].error is not None:
        failed = pulls.pop(name)
        # Nothing of it was in the database: the row records the forgotten download.
        await run_in_threadpool(_record, server, actor, "model.remove", name,
                                {**admin_changes.model_values(failed.entry),
                                 "error": failed.error}, None)
        return Response(status_code=204)
    model = server.models.find(name)
    if _command_line(server, name):
        raise _not_registered(server, name)
    if model is not None and model.leases:
        raise APIError(409, f"The model `{name}` is answering {model.leases} request(s); "
                            "remove it when they have finished.", param="name", code="busy")

    def remove() -> bool:
        with server.accounts.db.transaction() as session:
            return admin_changes.remove_model(session, actor, name)

    if not await run_in_threadpool(remove):
        raise _not_registered(server, name)
    await server.models.registry.refresh(force=True)  # it is unloaded and no longer served
    return Response(status_code=204)


def _record(server: ServerState, actor: str, action: str, target: str,
            before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    """An audit row for a change outside the database (a load, an unload, a forgotten
    download), in its own transaction."""
    with server.accounts.db.transaction() as session:
        record_change(session, actor, action, target, before, after)


async def _state_changed(request: Request, server: ServerState, name: str, action: str,
                         before: str) -> ModelRow:
    """The model's row after a load or unload, recorded as `action` from `before`."""
    row = _find_row(server, request, name, await run_in_threadpool(_read_entries, server))
    await run_in_threadpool(_record, server, admin_actor(request), action, name,
                            {"state": before}, {"state": row.state})
    return row


async def _registered(request: Request, name: str
                      ) -> tuple[ServerState, ServedModel | ServedEmbedder | ServedTranscriber
                                 | ServedReranker]:
    server = _server(request)
    await server.models.registry.refresh(force=True)
    found = (server.models.find(name) or server.models.find_embedder(name)
             or server.models.find_transcriber(name) or server.models.find_reranker(name))
    if found is None:
        raise APIError(404, f"No model `{name}` is registered.", param="name",
                       code="not_found")
    return server, found


@router.post("/models/{name}/load")
async def load_model(name: str, request: Request) -> ModelRow:
    """Load a model now (making room as a request would; 503 with the budget's sentence if
    it does not fit); answers once it is ready."""
    server, found = await _registered(request, name)
    before = found.state
    if isinstance(found, (ServedEmbedder, ServedReranker)):
        await found.wake(server.settings.retry_after_s)
    elif isinstance(found, ServedTranscriber):
        await server.models.load_transcriber(found)
    else:
        await server.models.acquire(found)
        server.models.release(found)
    return await _state_changed(request, server, name, "model.load", before)


@router.post("/models/{name}/unload")
async def unload_model(name: str, request: Request) -> ModelRow:
    """Free a model's memory now (it loads again on its next request); 409 while requests
    use it or for the command line's model."""
    server, found = await _registered(request, name)
    before = found.state
    if _command_line(server, name):
        raise APIError(409, f"The model `{name}` is served from the command line: it stays "
                            "loaded.", param="name", code="pinned")
    if isinstance(found, (ServedEmbedder, ServedTranscriber, ServedReranker)):
        embedder = (found.embedder if isinstance(found, ServedEmbedder) else
                    found.transcriber if isinstance(found, ServedTranscriber) else
                    found.reranker)
        if embedder.is_ready:
            if not embedder.sleep():
                raise APIError(409, f"The model `{name}` is answering requests; unload it "
                                    "when it is idle.", param="name", code="busy")
            found.resting = UNLOADED
            await embedder.until_asleep()
    elif found.in_memory and not await server.models.unload(found):
        raise APIError(409, f"The model `{name}` is answering {found.leases} request(s) or "
                            "loading; unload it when it is idle.", param="name", code="busy")
    return await _state_changed(request, server, name, "model.unload", before)


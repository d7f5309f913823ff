"""create_app: the FastAPI app over an AsyncLLM and the SQLite database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from officellm.app.accounts.accounts import Accounts
from officellm.app.admin import router as admin_router
from officellm.app.admission.admission import AdmissionControl
from officellm.app.admission.auth import ForwardedPeople, make_authenticator
from officellm.app.admission.auth_throttle import AuthThrottle
from officellm.app.admission.body_limit import BodySizeLimit
from officellm.app.anthropic.routes import router as anthropic_router
from officellm.app.db import Database, prepare_database
from officellm.app.db.column_types import utcnow
from officellm.app.db.paths import kv_disk_dir
from officellm.app.db.registered_models import list_entries
from officellm.app.db.threads import active_thread_counts
from officellm.app.db.users import user_names
from officellm.app.error_handlers import install_error_handlers
from officellm.app.models.idle_sleep import run_idle_sleep
from officellm.app.models.model_pool import ModelPool
from officellm.app.observability.metrics import ServerMetrics
from officellm.app.observability.model_windows import ModelWindows
from officellm.app.observability.refusals import Refusals
from officellm.app.observability.stats_sampler import run_sampler
from officellm.app.openai.routes import (
    audio,
    chat,
    completions,
    embeddings,
    models,
    monitoring,
    rerank,
    responses,
    tokenize,
)
from officellm.app.registry.entry import BUNDLED, EMBED, ModelEntry
from officellm.app.server_settings import ACTIVE_THREAD_MINUTES, ServerSettings
from officellm.app.serving.replica_header import ReplicaHeader
from officellm.app.serving.replica_heartbeat import ReplicaIdentity, run_heartbeat
from officellm.app.serving.state import ServerState
from officellm.engine import (
    BUNDLED_EMBEDDER,
    KV_DISK_AUTO,
    EngineConfig,
    LLMEngine,
)

logger = logging.getLogger("officellm.server")

EngineFactory = Callable[[], LLMEngine]


def read_registry(db: Database) -> list[ModelEntry]:
    """The registry's entries (the models table), read by the pool on start and when a
    request names a model it does not know yet."""
    with db.session() as session:
        return list_entries(session)


def command_line_entry(settings: ServerSettings) -> ModelEntry:
    """The model of `officellm serve [MODEL]` as the registry's first, pinned entry: named
    by --served-model-name or as the engine names itself (engine.default_model_name, known
    before it loads); --model-alias's patterns reach it."""
    return ModelEntry(name="", source=settings.engine.model or BUNDLED, pinned=True,
                      aliases=tuple(settings.model_aliases))


def command_line_embedder(settings: ServerSettings) -> ModelEntry | None:
    """--embedding-model as a pinned embed entry, named by --embedding-model-name or its
    directory's name (None: none asked for)."""
    source = settings.embedding_model
    if source is None:
        return None
    bundled = source == BUNDLED_EMBEDDER
    name = settings.embedding_model_name or (BUNDLED_EMBEDDER if bundled else Path(source).name)
    return ModelEntry(name=name, source=source, kind=EMBED, pinned=True)


def kv_disk_settings(engine: EngineConfig, db: Database) -> EngineConfig:
    """The engine's disk tier as the server runs it: `auto` in the data directory (beside
    the database, or the shared one's files), sealed under a key derived from the install
    key (docs/kv_tiers.md)."""
    if engine.kv_disk_dir is None:
        return engine
    folder = engine.kv_disk_dir
    if folder == KV_DISK_AUTO:
        folder = str(kv_disk_dir(db.files_dir))
    key = engine.kv_disk_key or db.kv_disk_key()
    return replace(engine, kv_disk_dir=folder, kv_disk_key=key)


def create_app(settings: ServerSettings, engine_factory: EngineFactory | None = None,
               db: Database | None = None) -> FastAPI:
    """The OpenAI-compatible app and the admin API. The engine loads in the background once
    the app starts (its lifespan), so /health answers 503 while loading and 200 when ready.

    `db`: an upgraded Database (officellm serve passes the one it prepared, and closes it);
    None opens and upgrades settings.database, closed when the app stops.
    """
    owns_db = db is None
    if db is None:
        db, token_file = prepare_database(settings.database)
        if token_file is not None:
            logger.info("Admin token written to %s (readable by this user only)", token_file)
    settings.engine = kv_disk_settings(settings.engine, db)
    windows = ModelWindows(settings.stats_window_s)
    # `state` is bound below, before any scrape.
    server_metrics = ServerMetrics(lambda: state.models.engines(), lambda: state.model_name,
                                   windows)
    accounts = Accounts.open(db, owns_db=owns_db)
    refusals = Refusals(server_metrics, accounts)
    pool = ModelPool(settings, server_metrics, refusals, settings.memory_budget)
    pool.add(command_line_entry(settings), engine_factory, settings.served_model_name)

    def active_threads() -> dict[str, int]:
        with db.session() as session:
            return active_thread_counts(session, utcnow() - timedelta(minutes=ACTIVE_THREAD_MINUTES))

    server_metrics.track_active_threads(active_threads)

    def names(ids: Iterable[int]) -> Mapping[int, str]:
        with db.session() as session:
            return user_names(session, ids)

    server_metrics.track_sharing(names)

    me = ReplicaIdentity.of(settings.host, settings.port, settings.replica_name,
                            settings.advertise_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        accounts.start()
        pool.start(lambda: read_registry(db))
        # The dashboard's rates and preemption events: every model's engine.
        sampler = asyncio.ensure_future(run_sampler(pool.engines, windows, accounts, names))
        heartbeat = asyncio.ensure_future(run_heartbeat(db, me, lambda: state.model_name))
        tasks = [sampler, heartbeat]
        tasks.append(asyncio.ensure_future(run_idle_sleep(pool)))
        await pool.registry.refresh(force=True)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            pool.stop(timeout=10.0)
            # After the engine: every request has ended, so its usage is queued; close()
            # writes it all (a clean stop loses no committed count).
            accounts.close()

    admission = AdmissionControl(accounts, refusals, settings.engine.max_num_seqs,
                                 settings.max_waiting_requests, settings.retry_after_s,
                                 share_across_models=settings.engine.scheduling_policy == "fair")
    server_metrics.in_flight.set_function(lambda: admission.in_flight)
    embedding = command_line_embedder(settings)
    if embedding is not None:
        pool.add_embedder(embedding, command_line=True)
    state = ServerState(settings=settings, models=pool, metrics=server_metrics,
                        accounts=accounts, stats_windows=windows, admission=admission,
                        refusals=refusals, auth_throttle=AuthThrottle(settings.auth_failure_limit),
                        created=int(time.time()))
    app = FastAPI(title="officellm", version="0.1.0", lifespan=lifespan)
    app.state.server = state
    app.state.replica = me
    app.state.authenticator = make_authenticator(db, settings.api_keys, settings.no_auth)
    app.state.people = ForwardedPeople(db)
    install_error_handlers(app)
    # An audio upload's own limit (--audio-max-bytes), with room for the form's other fields.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes,
                       path_limits={"/v1/audio/": settings.audio_max_bytes + 64 * 1024})
    app.add_middleware(ReplicaHeader, name=me.name)
    if settings.cors_origins:
        # Off unless configured: without CORS headers no other site's page, opened in an
        # office browser, can call the API with a key the browser holds.
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST", "PUT", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-Thread-Id"])
    for module in (chat, completions, responses, embeddings, rerank, models, tokenize,
                   monitoring, audio):
        app.include_router(module.router)
    app.include_router(anthropic_router)
    app.include_router(admin_router)
    return app

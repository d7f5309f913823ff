"""What the routes share, kept on `officellm.app.state.server`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fastapi import Request

from officellm.app.accounts.accounts import Accounts
from officellm.app.admission.admission import Admission, AdmissionControl
from officellm.app.admission.auth_throttle import AuthThrottle
from officellm.app.errors import unavailable
from officellm.app.models.model_pool import ModelPool
from officellm.app.models.served_model import ServedModel
from officellm.app.observability.metrics import ServerMetrics
from officellm.app.observability.model_windows import ModelWindows
from officellm.app.observability.refusals import Refusals
from officellm.app.registry.downloads import Downloads
from officellm.app.server_settings import ServerSettings

logger = logging.getLogger("officellm.server")


@dataclass
class ServerState:
    """One app's settings, models, metrics, database side and admission."""

    settings: ServerSettings
    models: ModelPool
    metrics: ServerMetrics
    accounts: Accounts
    stats_windows: ModelWindows  # /admin/stats' recent rates and latencies, per model
    admission: AdmissionControl
    refusals: Refusals
    auth_throttle: AuthThrottle  # failed-auth attempts per client address
    created: int = 0  # unix time the app was built; /v1/models reports it
    downloads: Downloads = field(default_factory=Downloads)  # Hub downloads for the registry
    started_monotonic: float = field(default_factory=time.monotonic)  # for uptime

    @property
    def default_model(self) -> ServedModel:
        """The command line's model: requests that name none get it."""
        return self.models.default

    @property
    def model_name(self) -> str | None:
        """The default model's name, known before it loads (metrics, the replica's
        heartbeat); None only when its files cannot be found."""
        return self.models.default.name or None

    async def load_for(self, model: ServedModel, admission: Admission) -> None:
        """Make sure `model` is loaded for an admitted request, leased until the admission
        ends (a stream's too); a load's wait is the request's queue time. 503 if it cannot
        be loaded (the memory budget, a failed load)."""
        await self.models.acquire(model)
        admission.on_release(lambda: self.models.release(model))

    def check_ready(self) -> None:
        """503 with Retry-After unless the default model is ready and we are not shutting
        down (/health, the admin API's live numbers)."""
        self.admission.refuse_if_draining()
        engine = self.models.default.async_engine
        if not engine.is_ready:  # loading (only until the load ends), failed, stopped
            raise unavailable(engine.unavailable_reason(), self.settings.retry_after_s)

    def check_embedders_ready(self) -> None:
        """503 with Retry-After while a pinned embedding model (--embedding-model) is not
        ready (/health)."""
        for served in self.models.embedders:
            embedder = served.embedder
            if served.entry.pinned and not embedder.is_ready:
                raise unavailable(embedder.unavailable_reason(), self.settings.retry_after_s)


def get_server(request: Request) -> ServerState:
    """FastAPI dependency: this app's ServerState."""
    return request.app.state.server


async def admitted_server(request: Request) -> ServerState:
    """FastAPI dependency for the generation routes: 503 once shutdown has begun."""
    server: ServerState = request.app.state.server
    server.admission.refuse_if_draining()
    return server

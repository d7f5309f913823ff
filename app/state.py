"""What the routes share, kept on `app.state.server`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from app.async_engine import AsyncEngine, EngineState
from app.errors import APIError, unavailable
from app.lifecycle import Lifecycle
from app.logprobs import TokenText
from app.metrics import ServerMetrics
from app.settings import ServerSettings


@dataclass
class ServerState:
    """One app's settings, engine, metrics and admission state."""

    settings: ServerSettings
    async_engine: AsyncEngine
    metrics: ServerMetrics
    lifecycle: Lifecycle
    created: int = 0  # unix time the app was built; /v1/models reports it
    _token_text: TokenText | None = field(default=None, repr=False)

    @property
    def served_model_names(self) -> list[str]:
        """Names clients may use; the first is the one reported. Empty until loaded."""
        if self.settings.served_model_name:
            return list(self.settings.served_model_name)
        engine = self.async_engine.engine
        return [engine.model_name] if engine is not None else []

    @property
    def model_name(self) -> str | None:
        names = self.served_model_names
        return names[0] if names else None

    @property
    def token_text(self) -> TokenText:
        if self._token_text is None:
            assert self.async_engine.engine is not None
            self._token_text = TokenText(self.async_engine.engine.tokenizer)
        return self._token_text

    def check_ready(self) -> None:
        """503 with Retry-After unless the engine is ready and we are not shutting down."""
        retry = self.settings.retry_after_s
        if self.lifecycle.draining:
            raise unavailable("The server is shutting down; retry on another instance or later.",
                              retry)
        state = self.async_engine.state
        if state is EngineState.LOADING:
            raise unavailable("The model is still loading; try again shortly.", retry)
        if state is not EngineState.READY:
            raise unavailable(f"The engine is not available: {self.async_engine.error}", retry)

    def resolve_model(self, requested: str | None) -> str:
        """The served name for `requested` (None = the default); 404 for an unknown model."""
        names = self.served_model_names
        if requested is None or requested == "":
            return names[0]
        if requested not in names:
            raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                           code="model_not_found")
        return requested


def get_server(request: Request) -> ServerState:
    """FastAPI dependency: this app's ServerState."""
    return request.app.state.server


def admitted_server(request: Request) -> ServerState:
    """FastAPI dependency for routes that need the engine: 503 unless it can serve now."""
    server: ServerState = request.app.state.server
    server.check_ready()
    return server

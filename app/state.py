"""What the routes share, kept on `app.state.server`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from app.accounts import Accounts
from app.async_engine import AsyncEngine, EngineState
from app.auth_throttle import AuthThrottle
from app.chat_tokens import ChatTokenizer
from app.errors import APIError, unavailable
from app.lifecycle import Lifecycle
from app.logprobs import TokenText
from app.metrics import ServerMetrics
from app.overload import AdmissionLimit
from app.settings import ServerSettings
from app.stats_window import StatsWindow


@dataclass
class ServerState:
    """One app's settings, engine, metrics, database side and admission state."""

    settings: ServerSettings
    async_engine: AsyncEngine
    metrics: ServerMetrics
    lifecycle: Lifecycle
    accounts: Accounts
    stats_window: StatsWindow
    admission: AdmissionLimit  # the bounded waiting queue (--max-waiting-requests)
    auth_throttle: AuthThrottle  # failed-auth attempts per client address
    created: int = 0  # unix time the app was built; /v1/models reports it
    started_monotonic: float = field(default_factory=time.monotonic)  # for uptime
    _token_text: TokenText | None = field(default=None, repr=False)
    _chat_tokenizer: ChatTokenizer | None = field(default=None, repr=False)

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

    @property
    def chat_tokenizer(self) -> ChatTokenizer:
        """The served model's chat template for the policy check (off the engine thread)."""
        if self._chat_tokenizer is None:
            assert self.async_engine.engine is not None
            self._chat_tokenizer = ChatTokenizer(self.async_engine.engine.model_dir)
        return self._chat_tokenizer

    def context_cap(self, policy_cap: int | None) -> int | None:
        """A user's effective thread cap: the lowest of their policy's, the server's
        (--max-context-tokens) and the model's context length."""
        engine = self.async_engine.engine
        model_len = engine.max_model_len if engine is not None else None
        caps = [c for c in (policy_cap, self.settings.max_context_tokens, model_len)
                if c is not None]
        return min(caps) if caps else None

    def check_ready(self) -> None:
        """503 with Retry-After unless the engine is ready and we are not shutting down."""
        retry = self.settings.retry_after_s
        if self.lifecycle.draining:
            raise unavailable("The server is shutting down; retry on another instance or later.",
                              retry)
        state = self.async_engine.state
        if state is EngineState.LOADING:  # only until the load ends, either way
            raise unavailable("The model is still loading; try again shortly.", retry)
        if state is EngineState.DEAD:  # the load failed (serve is exiting) or the loop died
            raise unavailable(f"The engine failed: {self.async_engine.error}", retry)
        if state is not EngineState.READY:
            raise unavailable("The server is shutting down.", retry)

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

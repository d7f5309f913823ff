"""What the routes share, kept on `officellm.app.state.server`."""

from __future__ import annotations

import fnmatch
import logging
import time
from dataclasses import dataclass, field

from fastapi import Request

from officellm.app.accounts.accounts import Accounts
from officellm.app.admission.admission import AdmissionControl
from officellm.app.admission.auth_throttle import AuthThrottle
from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.errors import APIError, unavailable
from officellm.app.observability.metrics import ServerMetrics
from officellm.app.observability.refusals import Refusals
from officellm.app.observability.stats_window import StatsWindow
from officellm.app.server_settings import DEFAULT_MAX_TOKENS, ServerSettings
from officellm.app.serving.prompt import LengthLimits, PromptRenderer, Prompts
from officellm.app.serving.token_text import TokenText
from officellm.engine import AsyncEmbedder, AsyncLLM, EngineState, LLMEngine

logger = logging.getLogger("officellm.server")


@dataclass(frozen=True)
class LoadedModel:
    """What the server keeps of the model once loaded, also while it sleeps."""

    name: str
    model_dir: str
    max_model_len: int
    max_new_tokens: int | None


@dataclass
class ServerState:
    """One app's settings, engine, metrics, database side and admission."""

    settings: ServerSettings
    async_engine: AsyncLLM
    metrics: ServerMetrics
    accounts: Accounts
    stats_window: StatsWindow
    admission: AdmissionControl
    refusals: Refusals
    auth_throttle: AuthThrottle  # failed-auth attempts per client address
    # The embedding model (--embedding-model) and its name; None: no /v1/embeddings.
    embedder: AsyncEmbedder | None = None
    embedding_model_name: str | None = None
    created: int = 0  # unix time the app was built; /v1/models reports it
    started_monotonic: float = field(default_factory=time.monotonic)  # for uptime
    loaded: LoadedModel | None = None  # None until the model first loads
    _token_text: TokenText | None = field(default=None, repr=False)
    _prompts: Prompts | None = field(default=None, repr=False)
    _chat_formats: ChatFormats | None = field(default=None, repr=False)

    @property
    def served_model_names(self) -> list[str]:
        """Names clients may use; the first is the one reported. Empty until loaded."""
        if self.settings.served_model_name:
            return list(self.settings.served_model_name)
        return [self.loaded.name] if self.loaded is not None else []

    @property
    def default_max_tokens(self) -> int | None:
        """max_tokens for a request that sends none: --default-max-tokens, else the model's
        generation_config max_new_tokens, else DEFAULT_MAX_TOKENS; None (the flag's 0): up
        to the context window."""
        configured = self.settings.default_max_tokens
        if configured is not None:
            return configured or None
        own = self.loaded.max_new_tokens if self.loaded is not None else None
        return own or DEFAULT_MAX_TOKENS

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

    def engine_loaded(self, engine: LLMEngine) -> None:
        """Build the prompt side for the loaded model (AsyncLLM.on_ready: on the engine's
        thread, before any request is admitted), so no request pays for loading it; after a
        sleep, the same model again."""
        self.loaded = LoadedModel(engine.model_name, str(engine.model_dir), engine.max_model_len,
                                  engine.max_new_tokens)
        # The idle clock starts when the model is there: a load slower than the idle time
        # must not be followed by a sleep at once.
        self.admission.touch()
        self._prompts = Prompts(PromptRenderer(engine.model_dir),
                                LengthLimits(engine.input_processor, self.settings.max_context_tokens),
                                self.refusals)
        s = self.settings
        self._chat_formats = ChatFormats.resolve(
            engine.tokenizer.chat_template, s.tool_call_parser,
            s.reasoning_parser, s.enable_auto_tool_choice)

    @property
    def chat_formats(self) -> ChatFormats:
        """How the loaded model writes tool calls and reasoning."""
        assert self._chat_formats is not None, "only once the engine is ready"
        return self._chat_formats

    @property
    def prompts(self) -> Prompts:
        """Prompt rendering and length rules for the loaded model."""
        assert self._prompts is not None, "only once the engine is ready"
        return self._prompts

    def context_cap(self, policy_cap: int | None) -> int | None:
        """A user's effective thread cap: the lowest of their policy's, the server's
        (--max-context-tokens) and the model's context length."""
        model_len = self.loaded.max_model_len if self.loaded is not None else None
        caps = [c for c in (policy_cap, self.settings.max_context_tokens, model_len)
                if c is not None]
        return min(caps) if caps else None

    @property
    def model_state(self) -> str:
        """loading, ready, sleeping, dead or stopped: the chat model's lifecycle."""
        return self.async_engine.state.value

    async def ensure_awake(self) -> None:
        """Load the model again if it sleeps (--sleep-idle-seconds); the request waits,
        as for a long queue. Several waiting requests share one load."""
        self.admission.touch()  # the idle clock restarts: no sleep while it wakes
        if self.async_engine.state is not EngineState.SLEEPING and not self.async_engine.waking:
            return
        t0 = time.monotonic()
        woke = await self.async_engine.wake()
        self.admission.touch()
        if not woke:  # it stays asleep; the next request tries again
            raise unavailable(self.async_engine.unavailable_reason(),
                              self.settings.retry_after_s)
        seconds = time.monotonic() - t0
        self.metrics.model_loaded(seconds)
        logger.info("The model woke in %.1f s", seconds)

    def check_ready(self) -> None:
        """503 with Retry-After unless the engine is ready and we are not shutting down."""
        retry = self.settings.retry_after_s
        self.admission.refuse_if_draining()
        if not self.async_engine.is_ready:  # loading (only until the load ends), failed, stopped
            raise unavailable(self.async_engine.unavailable_reason(), retry)

    def resolve_model(self, requested: str | None) -> str:
        """The served name for `requested` (None = the default, or a name matching one of
        --model-alias's patterns); 404 for an unknown model."""
        names = self.served_model_names
        if requested is None or requested == "":
            return names[0]
        if requested == self.embedding_model_name:
            raise APIError(400, f"The model `{requested}` is an embedding model: it serves "
                           "/v1/embeddings only.", param="model")
        if any(fnmatch.fnmatchcase(requested, p) for p in self.settings.model_aliases):
            return names[0]
        if requested not in names:
            raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                           code="model_not_found")
        return requested

    def check_embedder_ready(self) -> None:
        """503 with Retry-After while the embedding model (if there is one) is not ready."""
        if self.embedder is not None and not self.embedder.is_ready:
            raise unavailable(self.embedder.unavailable_reason(), self.settings.retry_after_s)

    def resolve_embedder(self, requested: str | None) -> tuple[str, AsyncEmbedder]:
        """The embedding model for `requested` (None: the one there is) and its name: 400 for
        the chat model, 404 for an unknown name or none served, 503 while it loads."""
        if self.embedder is None or self.embedding_model_name is None:
            raise APIError(404, "This server serves no embedding model (start it with "
                           "--embedding-model).", param="model", code="model_not_found")
        if requested and requested != self.embedding_model_name:
            if requested in self.served_model_names:
                raise APIError(400, f"The model `{requested}` generates text; embeddings come "
                               f"from `{self.embedding_model_name}`.", param="model")
            raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                           code="model_not_found")
        self.admission.refuse_if_draining()
        self.check_embedder_ready()
        return self.embedding_model_name, self.embedder


def get_server(request: Request) -> ServerState:
    """FastAPI dependency: this app's ServerState."""
    return request.app.state.server


async def admitted_server(request: Request) -> ServerState:
    """FastAPI dependency for routes that need the engine: a sleeping model is woken (the
    request waits); then 503 unless it can serve now."""
    server: ServerState = request.app.state.server
    await server.ensure_awake()
    server.check_ready()
    return server

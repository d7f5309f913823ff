"""One generate model the server serves by name: its engine, what the server builds for it
once it has loaded (prompt rendering, chat formats, token text), and how it is used (leases,
last use), which the model pool plans loads and unloads by."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.errors import unavailable
from officellm.app.models.prompt import LengthLimits, PromptRenderer, Prompts
from officellm.app.models.served import Served
from officellm.app.models.token_text import TokenText
from officellm.app.observability.refusals import Refusals
from officellm.app.registry.entry import BUNDLED, ModelEntry
from officellm.app.server_settings import DEFAULT_MAX_TOKENS, ServerSettings
from officellm.engine import (
    AsyncLLM,
    EngineConfig,
    EngineFrontEnd,
    EngineState,
    ModelFootprint,
    default_model_name,
)


@dataclass(frozen=True)
class LoadedModel:
    """What the server keeps of the model once loaded, also while it sleeps."""

    name: str
    model_dir: str
    max_model_len: int
    max_new_tokens: int | None
    vision: bool = False  # it reads images (a vision tower and its processor)


class ServedModel(Served):
    """A registry entry and its engine (one AsyncLLM, its own KV pool)."""

    def __init__(self, entry: ModelEntry, async_engine: AsyncLLM, settings: ServerSettings,
                 refusals: Refusals, footprint: ModelFootprint | None = None,
                 served_names: list[str] | None = None) -> None:
        super().__init__(entry, async_engine, settings)
        self.async_engine = async_engine
        self.refusals = refusals
        self.footprint = footprint  # planned memory; None until estimated
        # --served-model-name for the command line's model; else the entry's name.
        self._served_names = list(served_names or [])
        self.loaded: LoadedModel | None = None
        self._name_before_load: str | None = None  # the unnamed model's, found once
        # Requests using it now (ModelPool.acquire and release, their one owner): it is not
        # unloaded under them.
        self.leases = 0
        self.loads = 0
        self._token_text: TokenText | None = None
        self._prompts: Prompts | None = None
        self._chat_formats: ChatFormats | None = None

    @property
    def name(self) -> str:
        """The name requests use and answers report ("" only for a command line's model
        whose files cannot be found, when no --served-model-name names it)."""
        names = self.names
        return names[0] if names else ""

    @property
    def names(self) -> list[str]:
        """Every name that reaches this model exactly. An entry without a name (the
        command line's model) is called what the engine calls it: before it has loaded,
        the name the engine will give itself (default_model_name, the one rule)."""
        if self._served_names:
            return list(self._served_names)
        if self.entry.name:
            return [self.entry.name]
        if self.loaded is not None:
            return [self.loaded.name]
        if self._name_before_load is None:
            try:
                self._name_before_load = default_model_name(self.engine_config().model)
            except FileNotFoundError:  # the load will fail and say so; no name to give
                return []
        return [self._name_before_load]

    def answers_to(self, requested: str) -> bool:
        """Whether a request's `model` names this model (or matches one of its aliases)."""
        return requested in self.names or any(fnmatch.fnmatchcase(requested, p)
                                              for p in self.entry.aliases)

    def engine_config(self) -> EngineConfig:
        """The server's engine knobs with the entry's source and serve options over them."""
        source = None if self.entry.source == BUNDLED else self.entry.source
        return replace(self.settings.engine, model=source, **self.entry.engine_options())

    # -- state -------------------------------------------------------------------------
    @property
    def in_memory(self) -> bool:
        """Loaded, loading or waking: its footprint counts against the budget."""
        return self.async_engine.waking or self.async_engine.state in (
            EngineState.LOADING, EngineState.READY)

    def check_ready(self, retry_after_s: int) -> None:
        """503 with Retry-After unless the engine is ready."""
        if not self.async_engine.is_ready:
            raise unavailable(self.async_engine.unavailable_reason(), retry_after_s)

    # -- what the server builds once it has loaded -------------------------------------
    def engine_loaded(self, engine: EngineFrontEnd) -> None:
        """Build the prompt side for the loaded model from its front end (AsyncLLM.on_ready:
        on the engine's lifecycle thread, before any request is admitted), so no request
        pays for it; after a sleep, the same model again."""
        vision = engine.info.vision
        self.loaded = LoadedModel(engine.model_name, str(engine.model_dir),
                                  engine.max_model_len, engine.max_new_tokens, vision)
        self.loads += 1
        # The idle clock starts when the model is there: a load slower than the idle time
        # must not be followed by a sleep at once.
        self.touch()
        self._token_text = TokenText(engine.tokenizer)
        self._prompts = Prompts(PromptRenderer(engine.model_dir, vision),
                                LengthLimits(engine.input_processor,
                                             self.settings.max_context_tokens),
                                self.refusals)
        s, options = self.settings, self.entry.options
        self._chat_formats = ChatFormats.resolve(
            engine.tokenizer.chat_template, options.get("tool_call_parser", s.tool_call_parser),
            options.get("reasoning_parser", s.reasoning_parser), s.enable_auto_tool_choice)

    @property
    def token_text(self) -> TokenText:
        assert self._token_text is not None, "only once the engine is ready"
        return self._token_text

    @property
    def chat_formats(self) -> ChatFormats:
        """How the model writes tool calls and reasoning."""
        assert self._chat_formats is not None, "only once the engine is ready"
        return self._chat_formats

    @property
    def prompts(self) -> Prompts:
        """Prompt rendering and length rules for the model."""
        assert self._prompts is not None, "only once the engine is ready"
        return self._prompts

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

    def context_cap(self, policy_cap: int | None) -> int | None:
        """A user's effective thread cap on this model: the lowest of their policy's, the
        server's (--max-context-tokens) and the model's context length."""
        model_len = self.loaded.max_model_len if self.loaded is not None else None
        caps = [c for c in (policy_cap, self.settings.max_context_tokens, model_len)
                if c is not None]
        return min(caps) if caps else None


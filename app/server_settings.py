"""The server's settings: one typed place, filled by `officellm serve` or by tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from officellm.app.chat.image_input import ImageLimits
from officellm.engine import EngineConfig

# A thread counts as active (/admin/stats, officellm:active_threads) while its user is
# plausibly still reading or typing.
ACTIVE_THREAD_MINUTES = 15
# max_tokens of a request that sends none, when the model's generation_config names none: a
# long answer, and a bound on a small model that would otherwise write to the end of its
# context (minutes on a CPU) for a front end that never sends max_tokens (Open WebUI).
DEFAULT_MAX_TOKENS = 2048
# max_tokens of a front end's background task (a chat's title, tags, follow-ups:
# app/policy/background_tasks.py) that sends none, and the most one that sends it gets: a
# title or a few suggestions is tens of tokens, and Open WebUI sends no max_tokens for them.
DEFAULT_TASK_MAX_TOKENS = 256
# The most pixels (width x height) of one image in a chat: an 8K screenshot (7680 x 4320).
# Refused from the header, before decoding: a tiny file can claim a huge picture.
DEFAULT_MAX_IMAGE_PIXELS = 7680 * 4320


@dataclass
class ServerSettings:
    """Everything `create_app` needs: the engine's EngineConfig, and the server's own."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: list[str] = field(default_factory=list)  # empty = the engine's name
    # An embedding model served on /v1/embeddings beside the chat model (`--embedding-model`):
    # a sentence-transformers directory, or BUNDLED_EMBEDDER for the bundled all-MiniLM-L6-v2;
    # its name in requests and /v1/models (None: the directory's name).
    embedding_model: str | None = None
    embedding_model_name: str | None = None
    # Glob patterns (`--model-alias 'claude-*'`): requests naming a model that matches one are
    # served by the served model, so a client with fixed model names (Claude Code) works.
    model_aliases: list[str] = field(default_factory=list)
    # Static keys (`--api-key`), accepted beside the database's per-user keys; key i (from 1)
    # is the user "key<i>", created in the database on first use of the flag.
    api_keys: list[str] = field(default_factory=list)
    no_auth: bool = False  # single-user desk mode: every request is the local user
    # A SQLite file's path or a database URL (postgresql+psycopg://...); None = officellm.db
    # in the user's data directory.
    database: str | None = None
    admin_remote: bool = False  # let non-loopback clients reach /admin (token still needed)
    # Routers trusted to name the client in X-Forwarded-For (None: uvicorn's default,
    # $FORWARDED_ALLOW_IPS or loopback).
    forwarded_allow_ips: str | None = None
    # This server among the replicas sharing its database (None: the machine's name and port,
    # and the address it listens on): app/serving/replica_heartbeat.py.
    replica_name: str | None = None
    advertise_url: str | None = None
    # Seconds without a request after which the model's weights and KV pool are freed, to be
    # loaded again by the next request (`--sleep-idle-seconds`, llama.cpp's name); None: never.
    sleep_idle_seconds: float | None = None
    # What the served models may take together (`--memory-budget`); None: the default,
    # engine.default_memory_budget (a share of the RAM, or --gpu-memory-utilization's).
    memory_budget: int | None = None
    # Each generate model's engine core in a process of its own (the default), or on a
    # thread of the server's process (`--engine-in-process`: one process, as before, for
    # comparison and debugging): docs/design.md, "Engine processes".
    engine_in_process: bool = False
    stats_window_s: float = 60.0  # what /admin/stats' rates and latency percentiles cover
    shutdown_timeout: float = 30.0
    profile: str = "office"
    # Longest prompt (a chat's length so far) accepted; None = only max_model_len limits it.
    max_context_tokens: int | None = None
    retry_after_s: int = 5  # what 503 answers tell clients to wait
    max_request_bytes: int = 10 * 1024 * 1024  # bodies over this get 413 (0: no limit)
    # Speech to text (/v1/audio/*): the largest audio file accepted (OpenAI's limit is 25 MB;
    # it replaces max_request_bytes on those routes) and the longest recording, in seconds.
    audio_max_bytes: int = 25 * 1024 * 1024
    audio_max_seconds: float = 3 * 3600.0
    # Requests queued beyond the max_num_seqs running; more get 429 + Retry-After at once
    # (app/admission/admission.py) rather than an unbounded wait.
    max_waiting_requests: int = 128
    # Refused tokens per client address per minute before that address gets 429 (0: off).
    auth_failure_limit: int = 10
    cors_origins: list[str] = field(default_factory=list)  # empty: no CORS headers at all
    # Tool calling and reasoning models (vLLM's flags). tool_choice "auto" reads the model's
    # own calls with the tool-call parser: hermes, llama3_json, auto (the format the chat
    # template teaches) or none. The reasoning parser (qwen3, deepseek_r1, auto: qwen3 when
    # the template writes <think>, none) moves thinking text to reasoning_content.
    enable_auto_tool_choice: bool = True
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    # max_tokens of a request that sends none: None = the model's generation_config
    # max_new_tokens, else DEFAULT_MAX_TOKENS; 0 = no default (up to the context window).
    default_max_tokens: int | None = None
    # A background task's max_tokens when it sends none, and its most when it does
    # (`--task-max-tokens`); None: no cap of its own (default_max_tokens, as any request).
    task_max_tokens: int | None = DEFAULT_TASK_MAX_TOKENS
    # Images in chat (app/chat/image_input.py, docs/configuration.md): how many one request
    # may hold, the most pixels of one, and whether http(s) image URLs are fetched by the
    # server (`--allow-image-urls`; off: the server reaches out to no address a client
    # names), with the most bytes and seconds one fetch may take.
    max_images_per_request: int = 8
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    allow_image_urls: bool = False
    image_fetch_max_bytes: int = 20 * 1024 * 1024
    image_fetch_timeout: float = 10.0

    @property
    def image_limits(self) -> ImageLimits:
        """The image knobs as the image loader takes them."""
        return ImageLimits(max_images=self.max_images_per_request,
                           max_pixels=self.max_image_pixels,
                           allow_urls=self.allow_image_urls,
                           fetch_max_bytes=self.image_fetch_max_bytes,
                           fetch_timeout_s=self.image_fetch_timeout)

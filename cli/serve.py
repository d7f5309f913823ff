"""`officellm serve [MODEL]`: the OpenAI-compatible server (uvicorn + FastAPI)."""

from __future__ import annotations

import argparse
import logging
import re
import sys

import uvicorn

from officellm.app.db import prepare_database
from officellm.app.profiles import PROFILES, apply_profile
from officellm.app.registry.entry import PARSER_OPTIONS
from officellm.app.server import create_app
from officellm.app.server_settings import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TASK_MAX_TOKENS,
    ServerSettings,
)
from officellm.app.serving.graceful_server import GracefulServer
from officellm.cli.db import add_db_argument, database_target
from officellm.engine import BUNDLED_EMBEDDER, EngineConfig, engine_knobs, parse_memory

logger = logging.getLogger("officellm.server")

# The exit status of a start that failed: the model did not load (the KV pool is too small for
# one request of --max-model-len, no such model, an unsupported one, a tensor-parallel worker
# that did not start). The reason is the last line of output, on stderr.
EXIT_LOAD_FAILED = 1



def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="Start the OpenAI-compatible server. Flags follow vLLM's names.")
    p.add_argument("model", nargs="?", default=None,
                   help="Hugging Face model directory or .gguf file (default: bundled SmolLM2)")
    p.add_argument("--embedding-model", default=None, metavar="SOURCE",
                   help="also serve this embedding model on /v1/embeddings: a "
                        "sentence-transformers directory, a decoder embedding model's "
                        f"directory (Qwen3-Embedding), or {BUNDLED_EMBEDDER} (bundled)")
    p.add_argument("--embedding-model-name", default=None, metavar="NAME",
                   help="the embedding model's name in requests and /v1/models (default: its "
                        "directory's name)")
    p.add_argument("--sleep-idle-seconds", type=float, default=0.0, metavar="N",
                   help="free the model's weights and KV pool after N seconds without a "
                        "request; the next request loads it again (default 0: never)")
    p.add_argument("--engine-in-process", action="store_true",
                   help="run every model's engine core on a thread of the server's process "
                        "instead of a process of its own (one process: for comparison and "
                        "debugging; a crash there stops the server)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="what the served models may take together, e.g. 12GiB: a model "
                        "loaded on demand first unloads the least recently used idle ones, "
                        "or is refused with 503 (default: 80%% of the RAM available at start, "
                        "or --gpu-memory-utilization of the GPU)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    engine = p.add_argument_group("engine (EngineConfig's knobs; vLLM's names)")
    for knob in engine_knobs():
        flags = ["--" + knob.name.replace("_", "-")] + ([knob.metadata["alias"]]
                                                       if knob.metadata["alias"] else [])
        parse = knob.metadata["parse"]
        # Default None: we know which flags the user gave (those override the profile).
        if parse is None:
            engine.add_argument(*flags, dest=knob.name, action=argparse.BooleanOptionalAction,
                                default=None, help=knob.metadata["help"])
        else:
            engine.add_argument(*flags, dest=knob.name, type=parse, default=None,
                                help=f"{knob.metadata['help']} (default: {knob.default})")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use for the model (default: the model's own)")
    p.add_argument("--model-alias", action="append", default=[], metavar="PATTERN",
                   help="also answer requests for model names matching this glob (repeatable), "
                        "e.g. 'claude-*' so Claude Code's default model names reach the served "
                        "model")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="also accept this static bearer key (repeatable), as user key<N>, "
                        "beside the per-user keys of `officellm keys issue`")
    p.add_argument("--no-auth", action="store_true",
                   help="no keys: every request is the local user (single-user desk mode); "
                        "conflicts with --api-key")
    add_db_argument(p, help_suffix="; upgraded at start")
    p.add_argument("--admin-remote", action="store_true",
                   help="let other machines reach /admin (default: this machine only); the "
                        "admin token is needed either way")
    p.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                   help="comma-separated addresses of routers (HAProxy) whose X-Forwarded-For "
                        "names the client, so the admin API's this-machine check and the "
                        "failed-login throttle see the client, not the router (uvicorn's "
                        "option; default $FORWARDED_ALLOW_IPS or 127.0.0.1,::1)")
    p.add_argument("--replica-name", default=None, metavar="NAME",
                   help="this server's name among the replicas sharing its database, in "
                        "/admin/replicas and the X-Officellm-Replica header (default: the "
                        "machine's name and the port)")
    p.add_argument("--advertise-url", default=None, metavar="URL",
                   help="where the console and the router reach this replica (default: "
                        "http://<listen address or machine name>:<port>)")
    p.add_argument("--max-context-tokens", type=int, default=None,
                   help="refuse prompts longer than this (0: no cap; default: the profile's)")
    p.add_argument("--max-request-bytes", type=int, default=10 * 1024 * 1024,
                   help="request bodies over this many bytes get 413 (default 10 MiB; 0: no limit)")
    p.add_argument("--audio-max-bytes", type=int, default=25 * 1024 * 1024,
                   help="the largest audio file /v1/audio/transcriptions and translations "
                        "accept (default 25 MiB, OpenAI's limit)")
    p.add_argument("--audio-max-seconds", type=float, default=3 * 3600.0,
                   help="the longest recording they accept, in seconds (default 3 hours)")
    p.add_argument("--max-waiting-requests", type=int, default=128,
                   help="requests that may wait beyond the --max-num-seqs running; more get "
                        "429 with Retry-After at once (default 128)")
    p.add_argument("--auth-failure-limit", type=int, default=10,
                   help="wrong keys or admin tokens one client address may send per minute "
                        "before it gets 429 (default 10; 0: no limit)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from this origin call the API (repeatable; "
                        "default: no CORS headers, so no other site's page can)")
    p.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction,
                   default=True, help="let the model decide to call tools (tool_choice auto), "
                                      "read by --tool-call-parser (default: on)")
    p.add_argument("--tool-call-parser", choices=PARSER_OPTIONS["tool_call_parser"],
                   default="auto", help="how the model writes tool calls: hermes (Qwen2.5, "
                   "Qwen3), llama3_json (Llama 3.1/3.2), harmony (gpt-oss), auto (from the "
                   "chat template; a template without a format is taught hermes), none (no "
                   "tool calling)")
    p.add_argument("--default-max-tokens", type=int, default=None, metavar="N",
                   help="max_tokens of a request that sends none (Open WebUI sends none): "
                        "default the model's generation_config max_new_tokens, else "
                        f"{DEFAULT_MAX_TOKENS}; 0: up to the context window")
    p.add_argument("--task-max-tokens", type=int, default=DEFAULT_TASK_MAX_TOKENS, metavar="N",
                   help="max_tokens of a front end's background task (Open WebUI's title, "
                        "tags, follow-ups, queries, autocomplete) that sends none, and the most "
                        f"one that sends it gets (default {DEFAULT_TASK_MAX_TOKENS}; 0: no cap "
                        "of its own)")
    p.add_argument("--max-images-per-request", type=int, default=8, metavar="N",
                   help="images one chat request may hold (default 8)")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_IMAGE_PIXELS,
                   metavar="N", help="the most pixels (width x height) of one image, read "
                   f"from its header before decoding (default {DEFAULT_MAX_IMAGE_PIXELS}: "
                   "an 8K screen)")
    p.add_argument("--allow-image-urls", action="store_true",
                   help="fetch http(s) image URLs sent in chats (default: off, only data "
                        "URIs are read; the server reaches no address a client names)")
    p.add_argument("--image-fetch-max-bytes", type=int, default=20 * 1024 * 1024, metavar="N",
                   help="the most bytes one image URL fetch reads (default 20 MiB)")
    p.add_argument("--image-fetch-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="the most seconds one image URL fetch takes, in all (default 10)")
    p.add_argument("--reasoning-parser", choices=PARSER_OPTIONS["reasoning_parser"],
                   default="auto", help="move a reasoning model's thinking into "
                   "reasoning_content: auto (harmony for gpt-oss's template, qwen3 when the "
                   "chat template writes <think>)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM (default 30)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="office",
                   help="defaults for a kind of deployment; flags override (default office)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> tuple[ServerSettings, list[str]]:
    """ServerSettings for the flags, with the profile applied under them; and the log lines."""
    if args.no_auth and args.api_key:
        raise ValueError("--no-auth and --api-key contradict each other; give one.")
    flags = {k.name: getattr(args, k.name) for k in engine_knobs()
             if getattr(args, k.name) is not None}
    s = ServerSettings(engine=EngineConfig(model=args.model, **flags),
                       host=args.host, port=args.port,
                       served_model_name=list(args.served_model_name or []),
                       model_aliases=list(args.model_alias),
                       embedding_model=args.embedding_model,
                       sleep_idle_seconds=args.sleep_idle_seconds or None,
                       engine_in_process=args.engine_in_process,
                       memory_budget=(parse_memory(args.memory_budget)
                                      if args.memory_budget is not None else None),
                       embedding_model_name=args.embedding_model_name,
                       api_keys=list(args.api_key), shutdown_timeout=args.shutdown_timeout,
                       max_request_bytes=args.max_request_bytes,
                       audio_max_bytes=args.audio_max_bytes,
                       audio_max_seconds=args.audio_max_seconds,
                       max_waiting_requests=args.max_waiting_requests,
                       cors_origins=list(args.cors_origin),
                       auth_failure_limit=args.auth_failure_limit,
                       enable_auto_tool_choice=args.enable_auto_tool_choice,
                       tool_call_parser=args.tool_call_parser,
                       default_max_tokens=args.default_max_tokens,
                       task_max_tokens=args.task_max_tokens or None,
                       reasoning_parser=args.reasoning_parser,
                       max_images_per_request=args.max_images_per_request,
                       max_image_pixels=args.max_image_pixels,
                       allow_image_urls=args.allow_image_urls,
                       image_fetch_max_bytes=args.image_fetch_max_bytes,
                       image_fetch_timeout=args.image_fetch_timeout,
                       no_auth=args.no_auth, admin_remote=args.admin_remote,
                       forwarded_allow_ips=args.forwarded_allow_ips,
                       replica_name=args.replica_name, advertise_url=args.advertise_url,
                       database=(str(target) if (target := database_target(args)) is not None
                                 else None))
    explicit = set(flags)
    if args.max_context_tokens is not None:
        explicit.add("max_context_tokens")
        s.max_context_tokens = args.max_context_tokens or None
    if args.sleep_idle_seconds < 0:
        raise ValueError("--sleep-idle-seconds must be 0 (never) or more.")
    if args.max_waiting_requests < 0:
        raise ValueError("--max-waiting-requests must be 0 or more.")
    # The replicas table's columns (app/db/tables.py Replica).
    # It is sent in a header (X-Officellm-Replica) and written in the router's configuration.
    if args.replica_name is not None and not re.fullmatch(r"[A-Za-z0-9._:-]{1,128}",
                                                          args.replica_name):
        raise ValueError("--replica-name must be 1 to 128 letters, digits, '.', '_', ':' or "
                         "'-'.")
    if args.advertise_url is not None and not 0 < len(args.advertise_url) <= 512:
        raise ValueError("--advertise-url must be 1 to 512 characters.")
    if args.default_max_tokens is not None and args.default_max_tokens < 0:
        raise ValueError("--default-max-tokens must be 0 (up to the context window) or more.")
    if args.task_max_tokens < 0:
        raise ValueError("--task-max-tokens must be 0 (no cap of its own) or more.")
    lines = apply_profile(s, args.profile, explicit)
    return s, lines


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, profile_lines = settings_from_args(args)
    for line in profile_lines:
        logger.info(line)
    # The schema is brought to head before anything else touches the file; a database from
    # an older officellm upgrades without losing a row (migrations/).
    db, token_file = prepare_database(settings.database)
    logger.info("Database: %s (schema %s)", db.name, db.current_revision())
    if token_file is not None:
        # The path, never the token: logs are read by more people than the file's owner.
        logger.info("Admin token created and written to %s (readable by this user only)",
                    token_file)
    else:
        logger.info("Admin token: in %s (made at first start)", db.admin_token_path)
    if settings.no_auth:
        logger.info("Auth: none (desk mode: every request is the local user)")
    else:
        static = f" and {len(settings.api_keys)} static --api-key key(s)" if settings.api_keys else ""
        logger.info("Auth: per-user keys from the database%s", static)
    logger.info("CORS: %s", ", ".join(settings.cors_origins) if settings.cors_origins
                else "off (no --cors-origin)")
    logger.info("Admin API: /admin on %s", "any address (--admin-remote)" if settings.admin_remote
                else "this machine only")
    try:
        app = create_app(settings, db=db)
        config = uvicorn.Config(app, host=settings.host, port=settings.port,
                                log_level=args.log_level.lower(), access_log=False,
                                log_config=None, timeout_graceful_shutdown=5,
                                proxy_headers=True,
                                forwarded_allow_ips=settings.forwarded_allow_ips)
        state = app.state.server
        # On a shared database this server is one of several replicas behind a router.
        server = GracefulServer(config, state.admission, state.models.abort_all,
                                settings.shutdown_timeout,
                                stop_listening_on_drain=not db.is_sqlite)
        # The engine thread says so when the command line's model fails to load; the server
        # then stops by itself (a registry model's failed load is that request's 503).
        state.default_model.async_engine.on_load_failure = server.engine_failed
        for served in state.models.embedders:  # --embedding-model's, so far
            served.embedder.on_load_failure = server.engine_failed
        server.run()
    finally:
        db.close()
    if server.load_failure is not None:
        logger.info("Server stopped: the model did not load")
        _print_last(server.load_failure.reason)
        return EXIT_LOAD_FAILED
    logger.info("Server stopped")
    return 0


def _print_last(line: str) -> None:
    """`line` as the last line of output, after every log line so far (a service manager's
    journal and the console show the last line as the reason)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)

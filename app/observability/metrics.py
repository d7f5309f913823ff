"""Prometheus metrics: vLLM's names (docs/design.md §5) so vLLM dashboards work, plus officellm's own.

Each app gets its own CollectorRegistry, so several apps in one process do not clash. Engine
gauges and counters are read from the AsyncLLM's latest stats snapshot at scrape time (a
custom collector), so they can never drift from the engine's own numbers. Latency histograms
are observed on the event loop as each step's outputs are processed (see LatencyTracker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from officellm.app.observability.model_windows import ModelWindows
from officellm.app.observability.sharing import NameLookup, user_ids, user_shares
from officellm.engine import AsyncLLM, EngineStats, IterationStats

# vLLM's buckets, so that existing dashboards' quantiles mean the same thing.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

ModelName = Callable[[], str | None]
# The engines to report, each with its model's name (the server's model pool).
Engines = Callable[[], list[tuple[str, AsyncLLM]]]
ActiveThreads = Callable[[], dict[str, int]]


class EngineCollector:
    """vLLM's engine gauges and counters, read from the stats snapshot at scrape time."""

    def __init__(self, engines: Engines) -> None:
        self._engines = engines

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for name, engine in self._engines():
            stats = engine.stats()
            if stats is None:
                continue
            values = [stats.num_running, stats.num_waiting, stats.kv_cache_usage,
                      stats.num_preemptions_total, stats.prompt_tokens_total,
                      stats.generation_tokens_total, stats.prefix_cache_queries,
                      stats.prefix_cache_hits, stats.spec_decode_num_drafts,
                      stats.spec_decode_num_draft_tokens,
                      stats.spec_decode_num_accepted_tokens, stats.kv_tier_queries,
                      stats.kv_tier_hits, stats.prompt_tokens_computed_total]
            for family, value in zip(families, values, strict=True):
                family.add_metric([name], value)
        return iter(families)

    @staticmethod
    def _families() -> list[Metric]:
        labels = ["model_name"]
        # CounterMetricFamily adds the "_total" suffix itself: pass vLLM's names without it.
        return [
            GaugeMetricFamily("vllm:num_requests_running",
                              "Number of requests in model execution batches.", labels=labels),
            GaugeMetricFamily("vllm:num_requests_waiting",
                              "Number of requests waiting to be processed.", labels=labels),
            GaugeMetricFamily("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.", labels=labels),
            CounterMetricFamily("vllm:num_preemptions",
                                "Cumulative number of preemptions from the engine.", labels=labels),
            CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                labels=labels),
            CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.",
                                labels=labels),
            CounterMetricFamily("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.",
                                labels=labels),
            CounterMetricFamily("vllm:prefix_cache_hits",
                                "Prefix cache hits, in terms of number of cached tokens.",
                                labels=labels),
            CounterMetricFamily("vllm:spec_decode_num_drafts",
                                "Number of spec decoding drafts.", labels=labels),
            CounterMetricFamily("vllm:spec_decode_num_draft_tokens",
                                "Number of draft tokens.", labels=labels),
            CounterMetricFamily("vllm:spec_decode_num_accepted_tokens",
                                "Number of accepted tokens.", labels=labels),
            CounterMetricFamily("vllm:external_prefix_cache_queries",
                                "External prefix cache queries (the KV disk tier), in terms "
                                "of number of queried tokens.", labels=labels),
            CounterMetricFamily("vllm:external_prefix_cache_hits",
                                "External prefix cache hits (the KV disk tier), in terms of "
                                "number of cached tokens.", labels=labels),
            CounterMetricFamily("officellm:prompt_tokens_computed",
                                "Prompt tokens run through the model: past their prefix hits, "
                                "and again after a preemption.", labels=labels),
        ]


class KVTiersCollector:
    """officellm:kv_host_* and officellm:kv_disk_*{model_name}: each engine's KV tiers below
    the pool (docs/kv_tiers.md), from its latest snapshot at scrape time; an engine without
    a tier is left out of that tier's families."""

    # Per tier: (its stats in EngineStats, then each family's kind, name, help and value).
    TIERS = (
        (lambda s: s.kv_host, [
            (GaugeMetricFamily, "officellm:kv_host_bytes", "Bytes of KV blocks in the host "
             "tier (RAM).", lambda t: t.bytes_used),
            (GaugeMetricFamily, "officellm:kv_host_capacity_bytes", "The host tier's size "
             "(--kv-offloading-size).", lambda t: t.capacity_bytes),
            (GaugeMetricFamily, "officellm:kv_host_blocks", "KV blocks in the host tier.",
             lambda t: t.blocks),
            (CounterMetricFamily, "officellm:kv_host_blocks_stored", "KV blocks copied to the "
             "host tier.", lambda t: t.blocks_stored),
            (CounterMetricFamily, "officellm:kv_host_blocks_read", "KV blocks copied back "
             "from the host tier instead of computed.", lambda t: t.blocks_read),
            (CounterMetricFamily, "officellm:kv_host_blocks_evicted", "KV blocks the host "
             "tier let go, least recently used first, to make room.", lambda t: t.blocks_evicted),
        ]),
        (lambda s: s.kv_disk, [
            (GaugeMetricFamily, "officellm:kv_disk_bytes", "Bytes of KV blocks in the disk "
             "tier.", lambda t: t.bytes_used),
            (GaugeMetricFamily, "officellm:kv_disk_capacity_bytes", "The disk tier's budget.",
             lambda t: t.capacity_bytes),
            (GaugeMetricFamily, "officellm:kv_disk_blocks", "KV blocks in the disk tier.",
             lambda t: t.files),
            (CounterMetricFamily, "officellm:kv_disk_blocks_written", "KV blocks written to "
             "the disk tier.", lambda t: t.blocks_written),
            (CounterMetricFamily, "officellm:kv_disk_blocks_read", "KV blocks read back from "
             "the disk tier instead of computed.", lambda t: t.blocks_read),
            (CounterMetricFamily, "officellm:kv_disk_blocks_unreadable", "Disk tier files "
             "found damaged, foreign or gone (each a miss, removed).", lambda t: t.blocks_unreadable),
            (CounterMetricFamily, "officellm:kv_disk_writes_dropped", "KV blocks not saved: "
             "the disk tier's write queue was full.", lambda t: t.writes_dropped),
        ]),
    )

    def __init__(self, engines: Engines) -> None:
        self._engines = engines

    def describe(self) -> Iterator[Metric]:
        return iter(family for families in self._families() for family, _ in families[1])

    def collect(self) -> Iterator[Metric]:
        tiers = self._families()
        for name, engine in self._engines():
            stats = engine.stats()
            if stats is None:
                continue
            for tier_of, families in tiers:
                tier = tier_of(stats)
                if tier is not None:
                    for family, value in families:
                        family.add_metric([name], value(tier))
        return iter(family for _, families in tiers for family, _ in families)

    @classmethod
    def _families(cls) -> list[tuple[Callable[[EngineStats], Any],
                                     list[tuple[Metric, Callable[[Any], int]]]]]:
        return [(tier_of, [(kind(name, text, labels=["model_name"]), value)
                           for kind, name, text, value in families])
                for tier_of, families in cls.TIERS]


class SharingCollector:
    """officellm:kv_blocks_held{user} and officellm:preemptions_total{user}: the engine's
    per-key numbers from its latest snapshot at scrape time, under user names looked up in
    the database then (the /metrics route scrapes on a worker thread)."""

    def __init__(self, engines: Engines, names: NameLookup) -> None:
        self._engines = engines
        self._names = names

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        held, preempted = families = self._families()
        for name, engine in self._engines():
            stats = engine.stats()
            if stats is None:
                continue
            for row in user_shares(stats, self._names(user_ids(stats))):
                held.add_metric([name, row.user], row.kv_blocks)
                preempted.add_metric([name, row.user], row.preemptions_total)
        return iter(families)

    @staticmethod
    def _families() -> list[Metric]:
        labels = ["model_name", "user"]
        return [
            GaugeMetricFamily("officellm:kv_blocks_held",
                              "KV-cache blocks held by the user's requests now.", labels=labels),
            CounterMetricFamily("officellm:preemptions",
                                "Preemptions of the user's requests since start.", labels=labels),
        ]


class ActiveThreadsCollector:
    """officellm:active_threads{user}: threads with a request in the last few minutes, read
    from the database at scrape time (the /metrics route scrapes on a worker thread)."""

    def __init__(self, active_threads: ActiveThreads, model_name: ModelName) -> None:
        self._active_threads = active_threads
        self._model_name = model_name

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        name = self._model_name() or "unknown"
        for user, count in sorted(self._active_threads().items()):
            family.add_metric([name, user], count)
        return iter([family])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("officellm:active_threads",
                                 "Threads with a request in the last 15 minutes, per user.",
                                 labels=["model_name", "user"])


class ServerMetrics:
    """All of one app's metrics, in its own registry."""

    def __init__(self, engines: Engines, model_name: ModelName,
                 windows: ModelWindows | None = None) -> None:
        """`engines`: every model's engine, by name; `model_name`: the default model's
        name, the label of what is not per model (refusals)."""
        self.registry = CollectorRegistry()
        self._engines = engines
        self._model_name = model_name
        self.windows = windows
        self.registry.register(EngineCollector(engines))
        self.registry.register(KVTiersCollector(engines))
        r, m = self.registry, ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", m,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", m,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", m,
                             buckets=E2E_BUCKETS, registry=r)
        # vLLM's buckets for it are its request-latency ones, E2E_BUCKETS here.
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", m,
                                    buckets=E2E_BUCKETS, registry=r)
        u = ["model_name", "user"]
        self.user_requests = Counter("officellm:requests", "Requests served, per user.", u,
                                     registry=r)
        self.user_prompt_tokens = Counter("officellm:prompt_tokens",
                                          "Prompt tokens of served requests, per user.", u,
                                          registry=r)
        self.user_generation_tokens = Counter("officellm:generation_tokens",
                                              "Generated tokens, per user.", u, registry=r)
        # A front end's background tasks (app/policy/background_tasks.py), apart: also counted
        # in the three above, which are everything a user's requests cost.
        self.task_requests = Counter("officellm:task_requests",
                                     "Front ends' background tasks served (titles, tags, "
                                     "follow-ups), per user.", u, registry=r)
        self.task_prompt_tokens = Counter("officellm:task_prompt_tokens",
                                          "Prompt tokens of front ends' background tasks, per "
                                          "user.", u, registry=r)
        self.task_generation_tokens = Counter("officellm:task_generation_tokens",
                                              "Tokens generated for front ends' background "
                                              "tasks, per user.", u, registry=r)
        self.user_refusals = Counter("officellm:refusals",
                                     "Requests refused (4xx/5xx), per user and reason.",
                                     u + ["reason"], registry=r)
        self.policy_refusals = Counter(
            "officellm:policy_refusals",
            "Requests stopped or truncated by a policy, per user, limit (reason) and action "
            "(reject, notify, truncate).", u + ["reason", "action"], registry=r)
        # No address label: an attacker must not be able to grow the metrics' cardinality.
        self.auth_failures = Counter("officellm:auth_failures",
                                     "Requests refused for a wrong API key or admin token.",
                                     registry=r)
        self.auth_throttled = Counter(
            "officellm:auth_throttled",
            "Requests refused with 429 because their address failed authentication too often.",
            registry=r)
        self.structured_requests = Counter(
            "officellm:structured_requests",
            "Requests with a constrained output, by kind: json_schema, json_object, regex, "
            "choice, grammar, tool_required, tool_named, tool_auto.",
            ["model_name", "kind"], registry=r)
        self.structured_by_kind: dict[str, int] = {}  # the same counts, for /admin/stats
        # Loads on demand (a first request, after idle sleep or an unload): how often, how long.
        self.model_wakes = Counter("officellm:model_wakes",
                                   "Times a model out of memory was loaded for a request "
                                   "(its first, or after sleeping or being unloaded).", m,
                                   registry=r)
        self.model_wake_seconds = Histogram(
            "officellm:model_wake_seconds", "Histogram of seconds a model out of memory took "
            "to load (the waiting requests' wait).", m, buckets=E2E_BUCKETS, registry=r)
        # Embeddings (/v1/embeddings), labelled with the embedding model's name.
        self.embedding_requests = Counter("officellm:embedding_requests",
                                          "Embedding requests served, per user.", u,
                                          registry=r)
        self.embedding_inputs = Counter("officellm:embedding_inputs",
                                        "Inputs embedded, per user.", u, registry=r)
        self.embedding_tokens = Counter("officellm:embedding_tokens",
                                        "Tokens of the inputs embedded, per user.", u,
                                        registry=r)
        # Speech to text (/v1/audio/*), labelled with the speech model's name.
        self.audio_requests = Counter("officellm:audio_requests",
                                      "Transcriptions and translations served, per user.", u,
                                      registry=r)
        self.audio_seconds = Counter("officellm:audio_seconds",
                                     "Seconds of audio transcribed or translated, per user.",
                                     u, registry=r)
        self.audio_windows = Counter("officellm:audio_windows",
                                     "30 s windows of audio decoded, per user.", u,
                                     registry=r)
        # Reranking (/v1/rerank, /v2/rerank, /score), labelled with the rerank model's name.
        self.rerank_requests = Counter("officellm:rerank_requests",
                                       "Rerank and score requests served, per user.", u,
                                       registry=r)
        self.rerank_documents = Counter("officellm:rerank_documents",
                                        "Query-document pairs scored, per user.", u,
                                        registry=r)
        self.rerank_tokens = Counter("officellm:rerank_tokens",
                                     "Tokens of the pairs scored, per user.", u, registry=r)
        self.in_flight = Gauge("officellm:requests_in_flight",
                               "Generation requests being served now.", registry=r)

    @property
    def model_name(self) -> str:
        return self._model_name() or "unknown"

    def record_structured(self, model: str, kind: str) -> None:
        """Count one request to `model` whose output a grammar or a tool-call parser shapes."""
        self.structured_requests.labels(model_name=model, kind=kind).inc()
        self.structured_by_kind[kind] = self.structured_by_kind.get(kind, 0) + 1

    def record_request(self, name: str, user: str, prompt_tokens: int,
                       generation_tokens: int, task: bool = False) -> None:
        """Count one finished request to the model `name` for its user; `task`: a front
        end's background task, counted apart as well."""
        self.user_requests.labels(name, user).inc()
        self.user_prompt_tokens.labels(name, user).inc(prompt_tokens)
        self.user_generation_tokens.labels(name, user).inc(generation_tokens)
        if task:
            self.task_requests.labels(name, user).inc()
            self.task_prompt_tokens.labels(name, user).inc(prompt_tokens)
            self.task_generation_tokens.labels(name, user).inc(generation_tokens)

    def model_loaded(self, name: str, seconds: float) -> None:
        """The model `name`, out of memory, loaded again in `seconds`."""
        self.model_wakes.labels(name).inc()
        self.model_wake_seconds.labels(name).observe(seconds)

    def record_embeddings(self, model: str, user: str, inputs: int, tokens: int) -> None:
        """Count one served embeddings request of `model` for its user."""
        self.embedding_requests.labels(model, user).inc()
        self.embedding_inputs.labels(model, user).inc(inputs)
        self.embedding_tokens.labels(model, user).inc(tokens)

    def record_transcription(self, model: str, user: str, seconds: float,
                             windows: int) -> None:
        """Count one served transcription or translation of `model` for its user."""
        self.audio_requests.labels(model, user).inc()
        self.audio_seconds.labels(model, user).inc(seconds)
        self.audio_windows.labels(model, user).inc(windows)
    def record_rerank(self, model: str, user: str, documents: int, tokens: int) -> None:
        """Count one served rerank or score request of `model` for its user."""
        self.rerank_requests.labels(model, user).inc()
        self.rerank_documents.labels(model, user).inc(documents)
        self.rerank_tokens.labels(model, user).inc(tokens)

    def record_refusal(self, user: str, reason: str) -> None:
        self.user_refusals.labels(self.model_name, user, reason).inc()

    def record_policy_refusal(self, user: str, reason: str, action: str) -> None:
        self.policy_refusals.labels(self.model_name, user, reason, action).inc()

    def track_sharing(self, names: NameLookup) -> None:
        """Export the per-user KV blocks and preemptions, names from `names(ids)`."""
        self.registry.register(SharingCollector(self._engines, names))

    def track_active_threads(self, active_threads: ActiveThreads) -> None:
        """Export officellm:active_threads from `active_threads()` (user -> count)."""
        self.registry.register(ActiveThreadsCollector(active_threads, self._model_name))

    def latency_tracker(self, model_name: ModelName) -> LatencyTracker:
        """The StepListener of one model's engine."""
        return LatencyTracker(self, model_name)


class LatencyTracker:
    """A StepListener observing TTFT, inter-token latency and e2e latency per request, and the
    queue time the engine core measured, from the engine's per-step latencies (streamed or
    not). Runs on the event loop."""

    def __init__(self, metrics: ServerMetrics, model_name: ModelName) -> None:
        self._m = metrics
        self._model_name = model_name
        self._windows = metrics.windows  # recent samples for /admin/stats' percentiles

    def on_step(self, stats: IterationStats, now: float) -> None:
        name = self._model_name() or "unknown"
        window = self._windows.of(name) if self._windows is not None else None
        for kind, histogram, values in (("ttft", self._m.ttft, stats.ttft),
                                        ("itl", self._m.itl, stats.itl),
                                        ("e2e", self._m.e2e, stats.e2e)):
            for value in values:
                histogram.labels(name).observe(value)
                if window is not None:
                    window.observe_latency(kind, value, now)
        for value in stats.queue:
            self._m.queue_time.labels(name).observe(value)

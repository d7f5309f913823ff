"""Recent history for /admin/stats: token rates, preemptions and latency percentiles over the
last `window_s` seconds (Prometheus histograms only give totals since start).

Latency samples arrive from the event loop (LatencyTracker); engine counters are sampled
once a second by the app (StatsSampler, which also turns new preemptions into events).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from officellm.app.percentiles import percentile
from officellm.engine import EngineStats

LATENCY_KINDS = ("ttft", "itl", "e2e")
# Bounds memory if the window is long and traffic heavy (itl is one sample per token).
MAX_SAMPLES = 200_000


@dataclass(frozen=True)
class CounterSample:
    t: float  # time.monotonic()
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions_total: int


class StatsWindow:
    """Thread-safe recent samples; every reader prunes what has left the window."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._latency: dict[str, deque[tuple[float, float]]] = {
            k: deque(maxlen=MAX_SAMPLES) for k in LATENCY_KINDS}
        self._counters: deque[CounterSample] = deque()

    def observe_latency(self, kind: str, seconds: float, now: float | None = None) -> None:
        with self._lock:
            self._latency[kind].append((now if now is not None else time.monotonic(), seconds))

    def add_counters(self, stats: EngineStats, now: float | None = None) -> int:
        """Record an engine snapshot; return the preemptions since the previous one."""
        sample = CounterSample(now if now is not None else time.monotonic(),
                               stats.prompt_tokens_total, stats.generation_tokens_total,
                               stats.num_preemptions_total)
        with self._lock:
            last = self._counters[-1] if self._counters else None
            if last is not None and sample.prompt_tokens_total < last.prompt_tokens_total:
                # The engine's counters started again (the model was unloaded and loaded
                # back): rates count from this sample, never negative.
                self._counters.clear()
                last = None
            self._counters.append(sample)
            self._prune(sample.t)
        return sample.num_preemptions_total - last.num_preemptions_total if last else 0

    def _prune(self, now: float) -> None:  # with the lock held
        horizon = now - self.window_s
        # Keep one counter sample at or before the horizon: rates span the whole window.
        while len(self._counters) > 1 and self._counters[1].t <= horizon:
            self._counters.popleft()
        for samples in self._latency.values():
            while samples and samples[0][0] < horizon:
                samples.popleft()

    def rates(self, now: float | None = None) -> dict[str, float]:
        """Prompt and generation tokens per second and preemptions per minute."""
        now = now if now is not None else time.monotonic()
        with self._lock:
            self._prune(now)
            first = self._counters[0] if self._counters else None
            last = self._counters[-1] if self._counters else None
        zero = {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0,
                "preemptions_per_min": 0.0}
        if first is None or last is None or last.t <= first.t:
            return zero
        dt = last.t - first.t
        return {
            "prompt_tokens_per_s": (last.prompt_tokens_total - first.prompt_tokens_total) / dt,
            "generation_tokens_per_s":
                (last.generation_tokens_total - first.generation_tokens_total) / dt,
            "preemptions_per_min":
                (last.num_preemptions_total - first.num_preemptions_total) * 60.0 / dt,
        }

    def latency(self, now: float | None = None) -> dict[str, float | None]:
        """p50 and p99 of TTFT, inter-token and end-to-end latency, in seconds."""
        now = now if now is not None else time.monotonic()
        with self._lock:
            self._prune(now)
            values = {k: [v for _, v in s] for k, s in self._latency.items()}
        out: dict[str, float | None] = {}
        for kind in LATENCY_KINDS:
            out[f"{kind}_p50"] = percentile(values[kind], 50)
            out[f"{kind}_p99"] = percentile(values[kind], 99)
        out["window_s"] = self.window_s
        return out

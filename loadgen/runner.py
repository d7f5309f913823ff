"""Run one scenario against one server under its bounds, and collect everything measured."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from officellm.loadgen import scenarios, server_metrics
from officellm.loadgen.budget import Budget
from officellm.loadgen.client import ChatClient, RequestRecord


@dataclass
class Target:
    """Where to send load."""

    base_url: str
    api_key: str | None = None
    model: str | None = None  # default: the first model /v1/models lists
    max_context: int | None = None  # default: what the server says, else 2048
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {"ignore_eos": True}
    request_timeout: float = 300.0
    # noisy-neighbour: the heavy user's key (another user on the server; default api_key), and
    # keys for the light users, user i taking light_api_keys[i % len] (default api_key).
    heavy_api_key: str | None = None
    light_api_keys: list[str] = field(default_factory=list)

    def user_keys(self, config: scenarios.ScenarioConfig) -> dict[int, str]:
        """The per-user keys of a run (users without one use api_key)."""
        keys = {}
        if self.light_api_keys:
            keys = {u: self.light_api_keys[u % len(self.light_api_keys)]
                    for u in range(config.users)}
        if self.heavy_api_key:
            keys[config.heavy_user] = self.heavy_api_key
        return keys


@dataclass
class BenchResult:
    target: Target
    config: scenarios.ScenarioConfig
    requests_limit: int | None
    duration_limit: float | None
    model: str
    server_max_context: int | None
    t0: float
    wall: float
    records: list[RequestRecord]
    metrics_before: dict[str, float] | None
    metrics_after: dict[str, float] | None


async def server_info(http: httpx.AsyncClient) -> tuple[str, int | None]:
    """(model id, context length): officellm and vLLM say max_model_len in /v1/models,
    llama.cpp says n_ctx (per slot) in /props."""
    resp = await http.get("/v1/models", timeout=30.0)
    resp.raise_for_status()
    first = resp.json()["data"][0]
    max_len = first.get("max_model_len")
    if max_len is None:
        try:
            props = (await http.get("/props", timeout=10.0)).json()
            max_len = props.get("default_generation_settings", {}).get("n_ctx")
        except (httpx.HTTPError, ValueError):
            max_len = None
    return first["id"], max_len


async def run_bench(target: Target, config: scenarios.ScenarioConfig, requests: int | None,
                    duration: float | None) -> BenchResult:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    timeout = httpx.Timeout(target.request_timeout, connect=10.0)
    # One connection per concurrent stream, so the client never queues what the server should.
    streams = config.users + (config.heavy_requests if config.name == "noisy-neighbour" else 0)
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(base_url=target.base_url, headers=headers, timeout=timeout,
                                 limits=limits) as http:
        model, server_ctx = await server_info(http)
        model = target.model or model
        config.max_context = target.max_context or server_ctx or config.max_context
        before = await server_metrics.scrape(http)
        budget = Budget(requests, duration)
        run = scenarios.Run(ChatClient(http, model, dict(target.extra_body),
                                       target.user_keys(config)), budget, config)
        # Hard stop: the deadline plus one request's timeout; what is in flight then is cut off.
        hard = None if duration is None else duration + target.request_timeout
        try:
            await asyncio.wait_for(scenarios.play(run), timeout=hard)
        except asyncio.TimeoutError:
            for rec in run.records:
                if rec.end is None:
                    rec.error = "cut off at the run's time limit"
        wall = time.perf_counter() - budget.started
        after = await server_metrics.scrape(http)
    return BenchResult(target, config, requests, duration, model, server_ctx, budget.started,
                       wall, run.records, before, after)

"""What the tests of a running server share: the chat they send, the timeout, /metrics."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server_process import ServerProcess

TIMEOUT = 120.0
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def scrape(server: ServerProcess) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client's own parser."""
    r = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10)
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_idle(server: ServerProcess, timeout: float = 10.0) -> dict[tuple[str, tuple], float]:
    """/metrics once the engine runs and queues nothing: a request answered early (a stop
    string matched on the event loop) may still have a step in flight whose token the engine
    counts after the answer went out."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(server)
        busy = sum(v for (name, _), v in metrics.items()
                   if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
        if busy == 0 or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def model_state(server: ServerProcess) -> str:
    """The default model's state as /v1/models lists it (ready, sleeping, ...)."""
    r = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["state"]


def wait_for_state(server: ServerProcess, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while model_state(server) != wanted:
        assert time.monotonic() < deadline, f"the model is not {wanted}"
        time.sleep(0.2)

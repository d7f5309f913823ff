"""Idle sleep (`--sleep-idle-seconds`): after the idle time the model's weights and KV pool are
freed (the resident memory of the server and its engine process drops by at least their
size), the server stays healthy
and lists the model as sleeping without waking it, and the next request loads it again,
waits for it and gets the same greedy answer as before. The budget here is smaller than the
model: the default model loads at start whatever the budget, so its wake is never refused
for it (a CI machine's RAM free at start once gave a default budget below its footprint)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server_api import TIMEOUT, model_state, wait_for_state
from tests.support.server_process import API_KEY, ServerProcess

IDLE_S = 3  # longer than a busy CI machine takes from the load to the first request
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
ASK = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8,
       "temperature": 0}
# The bundled SmolLM2-135M in float32, dense: 0.5 GB of weights, and a 256 MiB KV pool.
FREED_AT_LEAST = 500 * 1024**2
BUDGET_BELOW_THE_MODEL = str(256 * 1024**2)


def rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and its children (the model's engine process)."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1]) * 1024
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            try:
                total += rss_bytes(int(child))
            except FileNotFoundError:  # it ended meanwhile
                pass
    return total


def chat(server: ServerProcess) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=ASK, headers=HEADERS,
                      timeout=TIMEOUT)


def wakes(server: ServerProcess) -> float:
    """officellm:model_wakes_total, from /metrics (0 before any wake)."""
    metrics = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=TIMEOUT).text
    found = [line for line in metrics.splitlines()
             if line.startswith("officellm:model_wakes_total{")]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


class Slept:
    """The server, its first answer and its resident memory awake and asleep."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        first = chat(server)
        assert first.status_code == 200, first.text
        self.first_answer = first.json()["choices"][0]["message"]["content"]
        self.wakes_before_sleeping = wakes(server)
        self.rss_awake = rss_bytes(server.proc.pid)
        wait_for_state(server, "sleeping")
        # The loop thread frees the model after the state changes: give it a few seconds.
        deadline = time.monotonic() + 15
        while True:
            self.rss_asleep = rss_bytes(server.proc.pid)
            if self.rss_awake - self.rss_asleep >= FREED_AT_LEAST or time.monotonic() > deadline:
                break
            time.sleep(0.2)


@pytest.fixture(scope="module")
def slept() -> Iterator[Slept]:
    if not Path("/proc/self/status").is_file():
        pytest.skip("resident memory is read from /proc (Linux)")
    with ServerProcess("--sleep-idle-seconds", str(IDLE_S),
                       "--memory-budget", BUDGET_BELOW_THE_MODEL, engine_processes=True) as server:
        yield Slept(server)


@pytest.mark.slow  # CI budget: docs/testing.md
def test_a_model_slower_to_load_than_the_idle_time_is_not_put_to_sleep_at_once(
        slept: Slept) -> None:
    """The idle clock starts when the model has loaded (here it loads in about the idle
    time on a busy machine): the first request found it awake."""
    assert slept.wakes_before_sleeping == 0


def test_an_idle_model_sleeps_and_frees_its_weights_and_kv_pool(slept: Slept) -> None:
    assert slept.rss_awake - slept.rss_asleep >= FREED_AT_LEAST, (
        f"RSS {slept.rss_awake / 2**20:.0f} MiB awake, {slept.rss_asleep / 2**20:.0f} MiB "
        "asleep")


def test_a_sleeping_server_is_healthy_and_says_so(slept: Slept) -> None:
    r = httpx.get(f"{slept.server.base_url}/health", timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.json()["state"] == "sleeping"


def test_listing_the_models_does_not_wake_it(slept: Slept) -> None:
    assert model_state(slept.server) == "sleeping"
    time.sleep(IDLE_S)
    assert model_state(slept.server) == "sleeping"


def test_the_next_request_wakes_it_and_gets_the_same_answer(slept: Slept) -> None:
    """Last in the file: it wakes the model."""
    r = chat(slept.server)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == slept.first_answer
    assert model_state(slept.server) == "ready"
    assert wakes(slept.server) == 1

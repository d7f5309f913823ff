"""Overload: a lunch-time burst of 10x what the server can hold gets 429 with Retry-After at
once for the excess, memory stays bounded, and every accepted request completes.

One real server: 2 running + 4 waiting = room for 6 requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.reliability.probes import rss_bytes, wait_idle
from tests.support.openai_errors import is_openai_error
from tests.support.server_process import ServerProcess

RUNNING, WAITING = 2, 4
BURST = 10 * (RUNNING + WAITING)
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_model_dir), "--max-model-len", "256", "--max-num-seqs",
                       str(RUNNING), "--max-waiting-requests", str(WAITING)) as srv:
        yield srv


@dataclass
class Answer:
    status: int
    seconds: float
    body: dict
    retry_after: str | None


async def _one(http: httpx.AsyncClient, i: int) -> Answer:
    t0 = time.monotonic()
    r = await http.post("/v1/completions", json={
        "prompt": f"Request {i}: tell me about the weather", "max_tokens": MAX_TOKENS,
        "ignore_eos": True, "temperature": 0})
    return Answer(r.status_code, time.monotonic() - t0, r.json(), r.headers.get("retry-after"))


async def _burst(server: ServerProcess) -> list[Answer]:
    limits = httpx.Limits(max_connections=BURST + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=120,
                                 limits=limits) as http:
        return await asyncio.gather(*(_one(http, i) for i in range(BURST)))


@dataclass
class BurstResult:
    answers: list[Answer]
    rss_before: int
    rss_peak: int


@pytest.fixture(scope="module")
def burst(server: ServerProcess) -> BurstResult:
    """One burst of BURST simultaneous requests, with the server's RSS sampled throughout."""
    pid = server.proc.pid
    wait_idle(server)
    before = rss_bytes(pid)
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        answers = asyncio.run(_burst(server))
    finally:
        done.set()
        sampler.join()
    return BurstResult(answers, before, peak[0])


def test_the_excess_of_a_burst_is_refused_with_429_and_retry_after(burst: BurstResult) -> None:
    refused = [a for a in burst.answers if a.status == 429]
    assert len(refused) >= BURST // 2, [a.status for a in burst.answers]
    for a in refused:
        assert is_openai_error(a.body) and a.body["error"]["code"] == "server_overloaded"
        assert a.retry_after is not None and int(a.retry_after) > 0


def test_refusals_come_at_once_not_after_a_wait(burst: BurstResult) -> None:
    refused = sorted(a.seconds for a in burst.answers if a.status == 429)
    served = sorted(a.seconds for a in burst.answers if a.status == 200)
    # However long the accepted requests take, a refusal never waits for one of them.
    assert refused[-1] < 3.0 and refused[len(refused) // 2] < served[-1]


def test_every_accepted_request_completes(burst: BurstResult) -> None:
    served = [a for a in burst.answers if a.status == 200]
    assert len(served) >= RUNNING + WAITING
    assert all(a.body["usage"]["completion_tokens"] == MAX_TOKENS for a in served)
    assert {a.status for a in burst.answers} <= {200, 429}


def test_memory_stays_bounded_during_the_burst(burst: BurstResult) -> None:
    assert burst.rss_peak - burst.rss_before < 64 * 1024**2, (burst.rss_before, burst.rss_peak)


def test_after_the_burst_nothing_runs_and_every_block_is_free(
        server: ServerProcess, burst: BurstResult) -> None:
    engine = wait_idle(server)
    assert engine["num_blocks_used"] == 0 and engine["kv_cache_usage"] == 0.0


def test_refusals_are_counted_in_metrics(server: ServerProcess, burst: BurstResult) -> None:
    r = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10)
    refused = sum(1 for a in burst.answers if a.status == 429)
    line = next(x for x in r.text.splitlines()
                if x.startswith("officellm:refusals_total") and 'reason="queue_full"' in x)
    assert float(line.rsplit(" ", 1)[1]) == refused


def test_the_server_serves_normally_after_the_burst(server: ServerProcess,
                                                    burst: BurstResult) -> None:
    r = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60,
                   json={"prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4

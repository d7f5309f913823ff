"""Each generate model's engine core runs in a process of its own (issue 56): a real server
with the bundled SmolLM2 (the default) and a tiny random-weight model from the registry, both
loaded, each in its engine process.

`kill -9` of one model's engine process while both stream: the other model's stream finishes
with every token; the killed model's requests get a 503 naming the model and the cause
(the signal) within 2 s; it is listed failed, holds no lease and no budget; its next request
starts it again and is answered. The server going (SIGTERM, or SIGKILL) leaves no engine
process behind.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from officellm.engine import BUNDLED_EMBEDDER
from tests.support.server_api import TIMEOUT
from tests.support.server_process import API_KEY, BASE_FLAGS, ServerProcess
from tests.support.tiny_models import shared_tiny_model

TINY_OPTIONS = {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "float32",
                "kv_cache_memory": "32MiB"}
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
DEFAULT_TOKENS = 80
TINY_TOKENS = 900  # under the tiny model's 1,024 positions: it is still streaming when killed


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class Stream:
    """A streamed chat read on a thread: the content chunks' arrival times and any error
    event (with the time it came)."""

    def __init__(self, url: str, model: str | None, tokens: int) -> None:
        body: dict = {"messages": [{"role": "user", "content": "Tell me a story."}],
                      "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
                      "stream": True, "stream_options": {"include_usage": True}}
        if model is not None:
            body["model"] = model
        self.body, self.url = body, url
        self.arrivals: list[float] = []
        self.error: dict | None = None
        self.error_at: float | None = None
        self.status: int | None = None
        self.completion_tokens: int | None = None
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=self.body,
                          headers=HEADERS, timeout=TIMEOUT) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    self.error, self.error_at = event["error"], time.monotonic()
                    return
                if event.get("usage"):
                    self.completion_tokens = event["usage"]["completion_tokens"]
                if event.get("choices"):
                    self.arrivals.append(time.monotonic())

    def wait_for_tokens(self, n: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while len(self.arrivals) < n:
            assert self.thread.is_alive() and time.monotonic() < deadline, self.error
            time.sleep(0.01)

    def join(self) -> None:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()


class Office:
    def __init__(self, server: ServerProcess) -> None:
        self.server, self.url = server, server.base_url
        self.admin = {"Authorization": f"Bearer {server.admin_token}"}

    def models(self) -> dict:
        r = httpx.get(f"{self.url}/admin/models", headers=self.admin, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()

    def row(self, name: str) -> dict:
        return next(m for m in self.models()["models"] if m["name"] == name)

    def default(self) -> dict:
        return next(m for m in self.models()["models"] if m["default"])

    def listed_state(self, name: str) -> str:
        r = httpx.get(f"{self.url}/v1/models", headers=HEADERS, timeout=TIMEOUT)
        return next(m["state"] for m in r.json()["data"] if m["id"] == name)

    def chat(self, model: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", headers=HEADERS, timeout=TIMEOUT,
                          json={"model": model, "max_tokens": 4, "temperature": 0,
                                "messages": [{"role": "user", "content": "Hi"}]})

    def wait_ready(self, name: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while self.row(name)["state"] != "ready":
            assert time.monotonic() < deadline, self.row(name)
            time.sleep(0.1)


@pytest.fixture(scope="module")
def office(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Office]:
    tiny = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    with ServerProcess(*BASE_FLAGS, "--embedding-model", BUNDLED_EMBEDDER,
                       engine_processes=True) as server:
        o = Office(server)
        r = httpx.post(f"{o.url}/admin/models", headers=o.admin, timeout=TIMEOUT,
                       json={"name": "tiny", "source": str(tiny), "options": TINY_OPTIONS,
                             "pinned": True})
        assert r.status_code == 201, r.text
        o.wait_ready("tiny")
        yield o


def test_each_model_runs_in_an_engine_process_of_its_own(office: Office) -> None:
    pids = {office.default()["engine_pid"], office.row("tiny")["engine_pid"]}
    assert None not in pids and len(pids) == 2 and office.server.proc.pid not in pids
    assert all(alive(pid) for pid in pids)


def test_killing_one_engine_fails_its_requests_with_a_503_naming_the_cause_and_spares_the_other(
        office: Office) -> None:
    default_name = office.default()["name"]
    pid = office.row("tiny")["engine_pid"]
    default_stream = Stream(office.url, None, DEFAULT_TOKENS)
    tiny_stream = Stream(office.url, "tiny", TINY_TOKENS)
    tiny_stream.wait_for_tokens(5)
    default_stream.wait_for_tokens(5)
    waiting: list[httpx.Response] = []
    blocked = threading.Thread(target=lambda: waiting.append(
        httpx.post(f"{office.url}/v1/chat/completions", headers=HEADERS, timeout=TIMEOUT,
                   json={"model": "tiny", "max_tokens": TINY_TOKENS, "min_tokens": TINY_TOKENS,
                         "messages": [{"role": "user", "content": "Count."}]})))
    blocked.start()
    time.sleep(0.2)  # in the engine with the stream
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    tiny_stream.join()
    blocked.join(TIMEOUT)
    default_stream.join()

    assert tiny_stream.error is not None, "the killed model's stream ended without an error"
    message = tiny_stream.error["message"]
    assert "SIGKILL" in message and "`tiny`" in message, message
    assert tiny_stream.error["code"] == "service_unavailable"
    assert tiny_stream.error_at - killed_at < 2.0
    assert waiting[0].status_code == 503 and "SIGKILL" in waiting[0].json()["error"]["message"]
    # The other model never noticed: every token it was asked for.
    assert default_stream.error is None and default_stream.completion_tokens == DEFAULT_TOKENS
    assert office.default()["name"] == default_name


def test_a_killed_engine_is_listed_failed_holding_no_lease_or_budget(office: Office) -> None:
    row = office.row("tiny")
    assert row["state"] == "failed" and "SIGKILL" in row["error"]
    assert row["requests_running"] == 0 and row["engine_pid"] is None
    assert office.listed_state("tiny") == "failed"
    stats = httpx.get(f"{office.url}/admin/stats", headers=office.admin, timeout=TIMEOUT).json()
    assert next(m for m in stats["models"] if m["name"] == "tiny")["state"] == "failed"
    models = office.models()
    assert models["used_bytes"] == office.default()["memory_bytes"]


def test_the_next_request_starts_a_killed_engine_again_and_is_answered(office: Office) -> None:
    r = office.chat("tiny")
    assert r.status_code == 200, r.text
    row = office.row("tiny")
    assert row["state"] == "ready" and alive(row["engine_pid"])
    assert office.default()["requests_running"] == 0 and row["requests_running"] == 0


def engine_pids(server: ServerProcess, module: bytes = b"engine_process") -> list[int]:
    """The server's child processes that run an engine (or `module`)."""
    # Listed per thread: the thread that started each one.
    pids = [int(p) for children in Path(f"/proc/{server.proc.pid}/task").glob("*/children")
            for p in children.read_text().split()]
    return [p for p in pids if module in Path(f"/proc/{p}/cmdline").read_bytes()]


def embed(office: Office) -> httpx.Response:
    return httpx.post(f"{office.url}/v1/embeddings", headers=HEADERS, timeout=TIMEOUT,
                      json={"model": BUNDLED_EMBEDDER, "input": ["the quarterly report"]})


def test_a_killed_embedding_process_is_listed_failed_and_the_next_request_restarts_it(
        office: Office) -> None:
    before = embed(office)
    assert before.status_code == 200, before.text
    [pid] = engine_pids(office.server, b"encoder_process")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while office.listed_state(BUNDLED_EMBEDDER) != "failed":
        assert time.monotonic() < deadline, "the embedding model is not listed failed"
        time.sleep(0.05)
    assert "SIGKILL" in office.row(BUNDLED_EMBEDDER)["error"]
    after = embed(office)
    assert after.status_code == 200, after.text
    assert after.json()["data"][0]["embedding"] == before.json()["data"][0]["embedding"]
    assert engine_pids(office.server, b"encoder_process") not in ([], [pid])


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_engine_process_outlives_the_server(sig: signal.Signals) -> None:
    with ServerProcess(*BASE_FLAGS, engine_processes=True) as server:
        deadline = time.monotonic() + TIMEOUT
        while not (pids := engine_pids(server)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(server.proc.pid, sig)
        server.proc.wait(TIMEOUT)
        assert wait_gone(pids, 5.0) == [], f"engine processes left after {sig.name}"

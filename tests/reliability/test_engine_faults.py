"""A fault in one request fails that request with a 500 in OpenAI's shape, and everyone else
goes on; if the engine loop itself dies, /health turns 503, the log says why, and the next
request starts it again.

One real server (tests/reliability/faulty_serve.py: `officellm serve` with a detokenizer and a
scheduler bug injected) over a tiny model whose token POISON has a NaN embedding row.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.reliability.faulty_serve import (
    DETOKENIZER_FAULT,
    SCHEDULER_FAULT,
    SCHEDULER_FAULT_MESSAGE,
)
from tests.support.openai_errors import is_openai_error, openai_error
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import build_tiny_model, poison_token

POISON = 777
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[ServerProcess]:
    model = poison_token(build_tiny_model("llama", tmp_path_factory.mktemp("poisoned"),
                                          smollm2_dir), POISON)
    with ServerProcess(str(model), "--max-model-len", "512",
                       module="tests.reliability.faulty_serve") as srv:
        yield srv


def complete(server: ServerProcess, prompt: list[int], **extra) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", headers=server.headers,
                      json={"prompt": prompt, "max_tokens": 8, **extra}, timeout=TIMEOUT)


def long_stream(server: ServerProcess, seen: dict) -> threading.Thread:
    """A healthy streaming completion of 200 tokens in the background; `seen` gets "chunks",
    the finish reason and the usage."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                           timeout=TIMEOUT, max_retries=0)

    def run() -> None:
        stream = client.completions.create(model="", prompt=[10, 11, 12], max_tokens=200,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        for chunk in stream:
            seen["chunks"] = seen.get("chunks", 0) + 1
            if chunk.choices and chunk.choices[0].finish_reason:
                seen["finish_reason"] = chunk.choices[0].finish_reason
            if chunk.usage:
                seen["usage"] = chunk.usage

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_nan_logits_fail_that_request_with_500_in_openai_shape(server: ServerProcess) -> None:
    err = openai_error(complete(server, [10, POISON, 12]), 500)
    assert err["type"] == "internal_server_error" and err["code"] == "internal_error"
    assert "NaN" in err["message"]


def test_a_detokenizer_error_fails_that_request_with_500(server: ServerProcess) -> None:
    err = openai_error(complete(server, [10, DETOKENIZER_FAULT, 12]), 500)
    assert "processing this request's output" in err["message"]


def test_the_openai_client_sees_an_internal_server_error(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                           timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model="", prompt=[10, POISON, 12], max_tokens=4)
    assert info.value.status_code == 500


def test_a_streamed_request_that_fails_ends_with_an_error_event(server: ServerProcess) -> None:
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", headers=server.headers,
                      json={"prompt": [10, POISON, 12], "stream": True, "max_tokens": 8},
                      timeout=TIMEOUT) as r:
        assert r.status_code == 200  # headers went out before the fault
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    assert is_openai_error(events[-1]) and events[-1]["error"]["type"] == "internal_server_error"


def test_other_requests_run_on_while_one_fails(server: ServerProcess) -> None:
    seen: dict = {}
    healthy = long_stream(server, seen)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not seen and time.monotonic() < deadline:  # the healthy one is decoding
            time.sleep(0.01)
        for bad in (POISON, DETOKENIZER_FAULT, POISON):
            openai_error(complete(server, [10, bad, 12]), 500)
    finally:
        healthy.join(TIMEOUT)
    assert seen["finish_reason"] == "length" and seen["usage"].completion_tokens == 200
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    r = complete(server, [10, 11, 12])
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_engine_faults_are_counted_per_user(server: ServerProcess) -> None:
    r = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10)
    assert 'reason="engine_error"' in r.text


# Last in this module: it kills the engine loop of the module's server.
def test_a_dead_engine_loop_turns_health_503_logs_why_and_the_next_request_restarts_it(
        server: ServerProcess) -> None:
    openai_error(complete(server, [10, SCHEDULER_FAULT, 12]), 503)
    health = openai_error(httpx.get(f"{server.base_url}/health", timeout=10), 503)
    assert SCHEDULER_FAULT_MESSAGE in health["message"]
    log = server.output()
    assert "The engine loop died; its requests get 503" in log
    assert f"RuntimeError: {SCHEDULER_FAULT_MESSAGE}" in log
    r = complete(server, [10, 11, 12])
    assert r.status_code == 200, r.text
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    assert server.proc.poll() is None

"""Acceptance 6: SIGTERM drains (503 for new requests, in-flight ones finish) and exits 0."""

from __future__ import annotations

import threading
import time

import httpx
import openai

from tests.support.server_process import ServerProcess

TIMEOUT = 120.0
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def _stream_in_thread(srv: ServerProcess, max_tokens: int, out: dict, started: threading.Event,
                      key: int) -> threading.Thread:
    def run() -> None:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=srv.api_key,
                               timeout=TIMEOUT, max_retries=0)
        text, finish = "", None
        try:
            for chunk in client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Story number {key}."}],
                    temperature=0, max_tokens=max_tokens, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
                    if text:
                        started.set()
                if chunk.usage is not None:
                    out[key] = (text, finish, chunk.usage.completion_tokens)
            out.setdefault(key, (text, finish, None))
        except Exception as exc:  # recorded for the assertion message
            out[key] = exc
        finally:
            started.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait_draining(srv: ServerProcess) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(f"{srv.base_url}/health", timeout=5).status_code != 503:
        assert time.monotonic() < deadline, "SIGTERM did not start draining"
        time.sleep(0.02)


def test_sigterm_lets_in_flight_finish_and_refuses_new() -> None:
    srv = ServerProcess("--shutdown-timeout", "120", engine_processes=True)
    try:
        srv.wait_ready()
        out: dict = {}
        events = [threading.Event() for _ in range(2)]
        threads = [_stream_in_thread(srv, 80, out, ev, i) for i, ev in enumerate(events)]
        for ev in events:
            assert ev.wait(TIMEOUT)
        assert not out, f"finished before SIGTERM: {out}"
        srv.terminate()
        _wait_draining(srv)
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", headers=srv.headers, timeout=10,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"].isdigit()
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert not out, "in-flight requests should still be running while new ones are refused"
        for t in threads:
            t.join(TIMEOUT)
        for i in range(2):
            text, finish, tokens = out[i]
            assert finish == "length" and tokens == 80 and text, out[i]
        assert srv.proc.wait(60) == 0, srv.output()
        log = srv.output()
        assert "Received SIGTERM" in log and "In-flight requests finished" in log
        assert "officellm.access" in log
    finally:
        srv.stop()


def test_shutdown_timeout_aborts_the_rest() -> None:
    srv = ServerProcess("--shutdown-timeout", "1")
    try:
        srv.wait_ready()
        out: dict = {}
        started = threading.Event()
        t = _stream_in_thread(srv, 3000, out, started, 0)
        assert started.wait(TIMEOUT)
        srv.terminate()
        t.join(30)
        assert not t.is_alive()
        text, finish, _ = out[0]
        assert finish == "abort" and text
        assert srv.proc.wait(30) == 0, srv.output()
        assert "aborting 1 requests" in srv.output()
    finally:
        srv.stop()

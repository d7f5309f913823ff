"""Oversized bodies, tool calling and unknown roles get a clear error; the server goes on."""

from __future__ import annotations

import httpx

from tests.server.test_openai_api import CHAT, TIMEOUT, _error
from tests.server.test_openai_api import client as client  # noqa: F401 - shared fixtures
from tests.server.test_openai_api import model as model  # noqa: F401
from tests.support.server_process import ServerProcess


def test_a_body_over_the_limit_gets_413_before_it_is_read(server: ServerProcess, model) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (11 * 1024 * 1024) + b'"}]}'
    err = _error(httpx.post(url, content=big, headers=server.headers | {
        "Content-Type": "application/json"}, timeout=TIMEOUT), 413)
    assert "10,485,760 bytes" in err["message"] and err["code"] == "request_too_large"


def test_a_chunked_body_over_the_limit_gets_413(server: ServerProcess) -> None:
    url = f"{server.base_url}/v1/chat/completions"

    def chunks():
        for _ in range(12):
            yield b"a" * (1024 * 1024)

    err = _error(httpx.post(url, content=chunks(), headers=server.headers | {
        "Content-Type": "application/json"}, timeout=TIMEOUT), 413)
    assert "larger than this server's limit" in err["message"]


def test_tool_calling_is_refused_plainly(server: ServerProcess, model) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    err = _error(httpx.post(url, json={"model": model, "messages": CHAT, "tools": tools},
                            headers=server.headers, timeout=TIMEOUT), 400)
    assert "Tool and function calling are not supported" in err["message"]


def test_unknown_roles_are_refused(server: ServerProcess, model) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    for role in ("tool", "wizard"):
        messages = CHAT + [{"role": role, "content": "hello"}]
        err = _error(httpx.post(url, json={"model": model, "messages": messages},
                                headers=server.headers, timeout=TIMEOUT), 400)
        assert f"Unsupported message role '{role}'" in err["message"]


def test_the_server_still_answers_after_the_refusals(server: ServerProcess, client, model) -> None:
    out = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=8)
    assert out.choices[0].message.content

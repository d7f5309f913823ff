"""Oversized bodies, tool calling and unknown roles get a clear error; the server goes on.

Each test stands alone (fixtures from tests/server/conftest.py): the refusals are helpers,
so the test that the server still answers makes them itself instead of relying on the tests
before it having run.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.openai_errors import openai_error as _error
from tests.support.server_api import CHAT, TIMEOUT
from tests.support.server_process import ServerProcess

UNKNOWN_ROLES = ("function", "wizard")  # "function": the deprecated function calling


def _chat_url(server: ServerProcess) -> str:
    return f"{server.base_url}/v1/chat/completions"


def refuse_a_body_over_the_limit(server: ServerProcess) -> dict:
    big = (b'{"model": "x", "messages": [{"role": "user", "content": "'
           + b"a" * (11 * 1024 * 1024) + b'"}]}')
    return _error(httpx.post(_chat_url(server), content=big, headers=server.headers | {
        "Content-Type": "application/json"}, timeout=TIMEOUT), 413)


def refuse_a_chunked_body_over_the_limit(server: ServerProcess) -> dict:
    def chunks():
        for _ in range(12):
            yield b"a" * (1024 * 1024)

    return _error(httpx.post(_chat_url(server), content=chunks(), headers=server.headers | {
        "Content-Type": "application/json"}, timeout=TIMEOUT), 413)


def refuse_role(server: ServerProcess, model: str, role: str) -> dict:
    messages = CHAT + [{"role": role, "content": "hello"}]
    return _error(httpx.post(_chat_url(server), json={"model": model, "messages": messages},
                             headers=server.headers, timeout=TIMEOUT), 400)


def test_a_body_over_the_limit_gets_413_before_it_is_read(server: ServerProcess) -> None:
    err = refuse_a_body_over_the_limit(server)
    assert "10,485,760 bytes" in err["message"] and err["code"] == "request_too_large"


def test_a_chunked_body_over_the_limit_gets_413(server: ServerProcess) -> None:
    err = refuse_a_chunked_body_over_the_limit(server)
    assert "larger than this server's limit" in err["message"]


@pytest.mark.parametrize("role", UNKNOWN_ROLES)
def test_unknown_roles_are_refused(server: ServerProcess, model: str, role: str) -> None:
    err = refuse_role(server, model, role)
    assert err["message"].startswith(f"Unsupported message role '{role}'; use one of ")
    assert not err["message"].endswith("..")


def test_the_server_still_answers_after_the_refusals(server: ServerProcess,
                                                     client: openai.OpenAI, model: str) -> None:
    refuse_a_body_over_the_limit(server)
    refuse_a_chunked_body_over_the_limit(server)
    for role in UNKNOWN_ROLES:
        refuse_role(server, model, role)
    out = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=8)
    assert out.choices[0].message.content

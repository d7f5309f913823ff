"""What every error answer must look like: OpenAI's `{"error": {message, type, param, code}}`,
or on Anthropic's routes (/v1/messages) Anthropic's `{"type": "error", "error": {type, message}}`."""

from __future__ import annotations

from typing import Any

import httpx

ERROR_FIELDS = {"message", "type", "param", "code"}


def is_openai_error(body: Any) -> bool:
    """True for exactly OpenAI's error object with a non-empty message."""
    return (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict)
            and set(body["error"]) == ERROR_FIELDS and isinstance(body["error"]["message"], str)
            and bool(body["error"]["message"]) and isinstance(body["error"]["type"], str))


def is_anthropic_error(body: Any) -> bool:
    """True for exactly Anthropic's error object with a non-empty message."""
    return (isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error"
            and isinstance(body["error"], dict) and set(body["error"]) == {"type", "message"}
            and isinstance(body["error"]["type"], str)
            and isinstance(body["error"]["message"], str) and bool(body["error"]["message"]))


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    """Assert `r` is a `status` error of type `kind` in Anthropic's shape; return its message."""
    assert r.status_code == status, r.text
    body = r.json()
    assert is_anthropic_error(body) and body["error"]["type"] == kind, body
    return body["error"]["message"]


def openai_error(r: httpx.Response, status: int) -> dict:
    """Assert `r` is a `status` error in OpenAI's shape; return its error object."""
    assert r.status_code == status, r.text
    body = r.json()
    assert is_openai_error(body), body
    return body["error"]

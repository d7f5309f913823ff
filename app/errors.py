"""The app's one error type: an error answered to the client in OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, or on Anthropic's routes (ANTHROPIC_PATHS) in
Anthropic's, {"type": "error", "error": {"type", "message"}}; raised by any layer (admission,
serving, the routes, the admin API) and answered by the handlers app/error_handlers.py
installs.

A leaf: it imports nothing of the app, so every layer may raise it without depending on the
protocol models (app/openai/answers.py's ErrorResponse documents the same body for OpenAPI).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from officellm.engine import SamplingParamsError

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


# Anthropic's error type for each status (its API reference, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
# The routes whose clients (Anthropic's SDKs, Claude Code) read Anthropic's error shape.
ANTHROPIC_PATHS = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    """Whether a request to `path` is answered in Anthropic's shapes."""
    return path == ANTHROPIC_PATHS or path.startswith(ANTHROPIC_PATHS + "/")


class APIError(Exception):
    """An error answered to the client as OpenAI does; raise it anywhere in a route."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self, for_front_end: bool = False) -> dict[str, Any]:
        """The JSON body: {"error": {"message", "type", "param", "code"}}, plus "detail" (the
        message again) for a front end: Open WebUI shows an error object's `detail`, and
        without one its chat window reads "Server connection failed" instead."""
        error: dict[str, Any] = {"message": self.message, "type": self.type,
                                 "param": self.param, "code": self.code}
        if for_front_end:
            error["detail"] = self.message
        return {"error": error}

    def anthropic_body(self) -> dict[str, Any]:
        """The body in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500
                                    else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, for_front_end: bool = False) -> JSONResponse:
        return JSONResponse(self.body(for_front_end), status_code=self.status,
                            headers=self.headers)

    def response_for(self, path: str, for_front_end: bool = False) -> JSONResponse:
        """The answer to a request for `path`, in its API's shape."""
        if speaks_anthropic(path):
            return JSONResponse(self.anthropic_body(), status_code=self.status,
                                headers=self.headers)
        return self.response(for_front_end)


def invalid_value(exc: ValueError, param: str | None = None) -> APIError:
    """A value the request may not have, as a 400: a SamplingParamsError names its field as
    `param`; any other ValueError is about `param`."""
    return APIError(400, str(exc),
                    param=exc.field if isinstance(exc, SamplingParamsError) else param)


def unavailable(message: str, retry_after_s: int) -> APIError:
    """503 with Retry-After: not ready yet, shutting down, or the engine failed."""
    return APIError(503, message, code="service_unavailable",
                    headers={"Retry-After": str(retry_after_s)})

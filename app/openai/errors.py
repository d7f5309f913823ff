"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.openai.answers import ErrorDetail, ErrorResponse
from app.openai.protocol import UNION_TAGS
from app.openai.responses_protocol import UNION_TAGS as RESPONSES_UNION_TAGS
from app.policy.types import Decision
from engine import SamplingParamsError

logger = logging.getLogger("officellm.server")

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

    def model(self, for_front_end: bool = False) -> ErrorResponse:
        extra = {"detail": self.message} if for_front_end else {}
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.type,
                                               param=self.param, code=self.code, **extra))

    def body(self, for_front_end: bool = False) -> dict[str, Any]:
        """The JSON body: {"error": {"message", "type", "param", "code"}}, plus "detail" for a
        front end (see `for_front_end`)."""
        return self.model(for_front_end).model_dump()

    def response(self, for_front_end: bool = False) -> JSONResponse:
        return JSONResponse(self.body(for_front_end), status_code=self.status,
                            headers=self.headers)


def for_front_end(request: Request) -> bool:
    """Whether this request came with a front-end key (app/admission/auth.py marks it). Open
    WebUI 0.12 shows the `detail` of an error object and ignores its `message`: an error
    without one reads "Server connection failed" in its chat window (open_webui/utils/
    middleware.py, non_streaming_chat_response_handler, and the frontend's error text)."""
    return bool(getattr(request.state, "front_end", False))


NOT_JSON = "The request body is not valid JSON."
# What FastAPI says when the body cannot be decoded at all (invalid UTF-8, nesting deeper than
# Python's parser recurses): the same fault for the client as a syntax error.
_FASTAPI_BODY_ERROR = "There was an error parsing the body"


# The OpenAI error code of each policy refusal (a Decision's reason).
POLICY_ERROR_CODES = {"max_tokens_per_day": "insufficient_quota",
                      "max_concurrent_requests": "rate_limit_exceeded",
                      "max_context_tokens": "context_cap_exceeded",
                      "max_turns": "turn_limit_exceeded"}


def decision_error(decision: Decision) -> APIError:
    """A policy's refusal as the client's error: its status, its sentence, Retry-After."""
    headers = ({"Retry-After": str(decision.retry_after)} if decision.retry_after is not None
               else None)
    return APIError(decision.status, decision.message or "Refused by policy.",
                    param="messages" if decision.status == 400 else None,
                    code=POLICY_ERROR_CODES.get(decision.reason or ""), headers=headers)


def invalid_value(exc: ValueError, param: str | None = None) -> APIError:
    """A value the request may not have, as a 400: a SamplingParamsError names its field as
    `param`; any other ValueError is about `param`."""
    return APIError(400, str(exc),
                    param=exc.field if isinstance(exc, SamplingParamsError) else param)


def unavailable(message: str, retry_after_s: int) -> APIError:
    """503 with Retry-After: not ready yet, shutting down, or the engine failed."""
    return APIError(503, message, code="service_unavailable",
                    headers={"Retry-After": str(retry_after_s)})


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())
           if p != "body" and p not in UNION_TAGS and p not in RESPONSES_UNION_TAGS]
    if first.get("type") == "json_invalid":
        return NOT_JSON, None
    param = ".".join(loc) or None
    msg = first.get("msg", "Invalid value")
    if first.get("type") == "value_error":  # our own sentence, raised in a validator
        msg = msg.removeprefix("Value error, ")
    msg = msg.removesuffix(".")
    return (f"{msg} (at '{param}')." if param else f"{msg}."), param


def install_error_handlers(app: FastAPI) -> None:
    """Make every error, FastAPI's own included, answer in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(for_front_end(request))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI answers 400, not FastAPI's 422 with its own body.
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response(for_front_end(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Not found: {request.method} {request.url.path}"
        elif exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
            message = f"{NOT_JSON.removesuffix('.')} (it must be UTF-8, nested at most a few " \
                      "hundred levels deep)."
        else:
            message = str(exc.detail)
        return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)
                        ).response(for_front_end(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, "Internal server error.").response(for_front_end(request))

"""Every error answered in its API's shape (app/errors.py's APIError: OpenAI's, Anthropic's on
/v1/messages), FastAPI's own included: a validation error is a 400 naming its field, not
FastAPI's 422 with its own body."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from officellm.app.anthropic.protocol import UNION_TAGS as ANTHROPIC_UNION_TAGS
from officellm.app.db.engines import UNAVAILABLE
from officellm.app.errors import APIError, unavailable
from officellm.app.openai.protocol import UNION_TAGS
from officellm.app.openai.responses_protocol import UNION_TAGS as RESPONSES_UNION_TAGS

logger = logging.getLogger("officellm.server")


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


DATABASE_UNAVAILABLE = ("The server's database is not answering, so this request was not "
                        "served and nothing was changed. Retry in a moment; the "
                        "administrator can see why in the server's log.")
# One log line per this many seconds of a database outage, not one per refused request.
DATABASE_LOG_INTERVAL_S = 30.0


# Union branch names pydantic puts in an error's path: no field of any request.
_UNION_TAGS = UNION_TAGS | RESPONSES_UNION_TAGS | ANTHROPIC_UNION_TAGS


def _answer(request: Request, error: APIError) -> JSONResponse:
    return error.response_for(request.url.path, for_front_end(request))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())
           if p != "body" and p not in _UNION_TAGS]
    if first.get("type") == "json_invalid":
        return NOT_JSON, None
    param = ".".join(loc) or None
    msg = first.get("msg", "Invalid value")
    if first.get("type") == "value_error":  # our own sentence, raised in a validator
        msg = msg.removeprefix("Value error, ")
    msg = msg.removesuffix(".")
    return (f"{msg} (at '{param}')." if param else f"{msg}."), param


def install_error_handlers(app: FastAPI) -> None:
    """Make every error, FastAPI's own included, answer in its API's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI and Anthropic answer 400, not FastAPI's 422 with its own body.
        message, param = _validation_message(exc)
        return _answer(request, APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Not found: {request.method} {request.url.path}"
        elif exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
            message = f"{NOT_JSON.removesuffix('.')} (it must be UTF-8, nested at most a few " \
                      "hundred levels deep)."
        else:
            message = str(exc.detail)
        return _answer(request, APIError(exc.status_code, message,
                                         headers=getattr(exc, "headers", None)))

    logged_at: float | None = None

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        nonlocal logged_at
        now = time.monotonic()
        if logged_at is None or now - logged_at >= DATABASE_LOG_INTERVAL_S:
            logged_at = now
            logger.error("The database is not answering (%s %s refused with 503): %s",
                         request.method, request.url.path, str(exc).splitlines()[0])
        retry_after = request.app.state.server.settings.retry_after_s
        return _answer(request, unavailable(DATABASE_UNAVAILABLE, retry_after))

    for error in UNAVAILABLE:
        app.add_exception_handler(error, _database)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error in %s %s", request.method, request.url.path)
        return _answer(request, APIError(500, "Internal server error."))

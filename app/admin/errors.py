"""The data layer's errors as admin API answers (OpenAI's error shape)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from officellm.app.db import AlreadyExists, NotFound
from officellm.app.errors import APIError


@contextmanager
def answered_errors(param: str | None = None) -> Iterator[None]:
    """NotFound -> 404, AlreadyExists -> 409, ValueError (bad input) -> 400."""
    try:
        yield
    except NotFound as exc:
        raise APIError(404, str(exc), param=param, code="not_found") from exc
    except AlreadyExists as exc:
        raise APIError(409, str(exc), param=param, code="already_exists") from exc
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from exc

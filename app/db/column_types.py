"""Column types shared by the models and the migrations."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (what every timestamp column stores)."""
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A UTC timestamp: stored naive (SQLite has no time zones), always returned tz-aware.

    Aware datetimes in other zones are converted to UTC on the way in, so comparisons in SQL
    (ORDER BY, ranges) stay correct; naive ones are taken to be UTC already.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value

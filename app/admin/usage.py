"""GET /admin/usage: who used how much of which model, day by day (never what they wrote)."""

from __future__ import annotations

from datetime import date

from fastapi import APIRouter, Query, Request

from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import UsageReport, usage_report_view
from officellm.app.db.usage import (
    DEFAULT_REPORT_DAYS,
    MAX_REPORT_DAYS,
    ReportBy,
    report_range,
    report_total,
    usage_report,
)
from officellm.app.serving.state import ServerState

router = APIRouter()


@router.get("/usage")
def get_usage(request: Request, since: date | None = None, until: date | None = None,
              by: ReportBy = "user", user: str | None = None, model: str | None = None,
              days: int = Query(DEFAULT_REPORT_DAYS, ge=1, le=MAX_REPORT_DAYS),
              ) -> UsageReport:
    """The UTC days `since` to `until` (both included; default: the `days` days up to
    today), summed by user, model or day, optionally of one user or model."""
    server: ServerState = request.app.state.server
    server.accounts.writer.flush()  # include the requests answered a moment ago
    with answered_errors("since"):
        since, until = report_range(since, until, days)
    with answered_errors("user"), server.accounts.db.session() as session:
        rows = usage_report(session, since, until, by, user=user, model=model)
    return usage_report_view(since, until, by, rows, report_total(rows))

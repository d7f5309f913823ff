"""Number formatting shared by the tabs (None reads as an em dash: no samples yet)."""

from __future__ import annotations


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def pct(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction:.1%}"


def rate(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:,.1f} {unit}"


def duration(seconds: float) -> str:
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s"


def size(num_bytes: float) -> str:
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if num_bytes >= div:
            return f"{num_bytes / div:,.2f} {unit}"
    return f"{num_bytes:,.0f} B"


def size_of(part: float, whole: float) -> str:
    """"2.1 of 8.0 GiB": both in the whole's unit, one decimal (a budget line)."""
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if whole >= div:
            return f"{part / div:,.1f} of {whole / div:,.1f} {unit}"
    return f"{part:,.0f} of {whole:,.0f} B"


def ago(stamp: str | float | None, now: float | None = None) -> str:
    """"12 s ago" for an ISO-8601 time (the admin API's) or a Unix time; "" when unknown."""
    import time
    from datetime import datetime

    if stamp is None or stamp == "":
        return ""
    if isinstance(stamp, (int, float)):
        t = float(stamp)
    else:
        try:
            t = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return str(stamp)
    secs = max(0, int((time.time() if now is None else now) - t))
    if secs < 60:
        return f"{secs} s ago"
    if secs < 3600:
        return f"{secs // 60} min ago"
    return f"{secs // 3600} h {secs % 3600 // 60:02d} min ago"


def kind_counts(counts: dict[str, int]) -> str:
    """Counts by kind, the commonest first: "json_schema 3 · tool_required 1" ("none")."""
    if not counts:
        return "none"
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return " · ".join(f"{kind} {n:,}" for kind, n in ranked)

"""The Capacity tab's data: the server's `GET /admin/plan` answer (docs/design.md §4), read as it is,
and the what-if question the tab sends to `POST /admin/plan`.

The server is the one source of these numbers (app/admin/live.py get_plan, and
app/admin/what_if.py for the what-if); the console does no arithmetic of its own on them. A field the server did not send reads as None, so the tab
can say "—" rather than guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def _int(d: dict[str, Any], key: str) -> int | None:
    value = d.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(d: dict[str, Any], key: str) -> float | None:
    value = d.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Plan:
    """`GET /admin/plan` (docs/admin_api.md). The `threads_at_*` are the server's ratios of
    pool tokens to thread tokens, like vLLM's "Maximum concurrency: 6.03x"."""

    model: str = ""
    bytes_per_token: int | None = None
    kv_cache_dtype: str = ""
    kv_cache_tokens: int | None = None
    kv_cache_bytes: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    avg_thread_tokens: int | None = None  # None before the first thread today
    threads_at_avg: float | None = None
    threads_at_cap: float | None = None
    threads_at_max_len: float | None = None
    cap: int | None = None  # the default policy's effective cap; None = no cap

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(
            model=str(d.get("model") or ""),
            bytes_per_token=_int(d, "bytes_per_token"), kv_cache_tokens=_int(d, "kv_cache_tokens"),
            kv_cache_dtype=str(d.get("kv_cache_dtype") or ""),
            kv_cache_bytes=_int(d, "kv_cache_bytes"), num_blocks=_int(d, "num_blocks"),
            block_size=_int(d, "block_size"), max_model_len=_int(d, "max_model_len"),
            avg_thread_tokens=_int(d, "avg_thread_tokens"),
            threads_at_avg=_float(d, "threads_at_avg"), threads_at_cap=_float(d, "threads_at_cap"),
            threads_at_max_len=_float(d, "threads_at_max_len"), cap=_int(d, "cap"),
        )


@dataclass(frozen=True)
class WhatIf:
    """`POST /admin/plan`'s question (docs/admin_api.md): `officellm plan` for another model or
    memory size, worked out by the server (the console imports no engine code)."""

    model: str
    memory: str
    kv_cache_dtype: str = "auto"
    avg_tokens: int = 4000

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

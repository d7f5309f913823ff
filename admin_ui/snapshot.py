"""`GET /admin/stats` as plain dataclasses, parsed leniently.

The console must keep drawing when the server is a little older or newer than itself, so a
missing field reads as 0 / None rather than raising.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Protocol


def _f(d: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = d.get(key)
    return float(value) if isinstance(value, (int, float)) else default


def _opt(d: dict[str, Any], key: str) -> float | None:
    value = d.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _with_counts(numbers: Any, d: dict[str, Any]) -> Any:
    """A tier's numbers with each of its int fields read from `d` (0 where missing)."""
    for f in fields(numbers):
        if f.type == "int":
            setattr(numbers, f.name, int(_f(d, f.name)))
    return numbers


class TierNumbers(Protocol):
    """What a KV tier's gauge shows (admin_ui/widgets/kv_tier_gauge.py)."""

    where: str
    blocks: int
    bytes_used: int
    capacity_bytes: int
    blocks_read: int

    @property
    def usage(self) -> float: ...

    @property
    def note(self) -> str: ...


@dataclass
class HostTierNumbers:
    """The engine's KV host tier in RAM (docs/kv_tiers.md), when it has one."""

    where = "in RAM"
    blocks: int = 0
    bytes_used: int = 0
    capacity_bytes: int = 0
    blocks_stored: int = 0
    blocks_read: int = 0
    blocks_evicted: int = 0
    pinned: bool = False

    @classmethod
    def from_json(cls, d: Any) -> HostTierNumbers | None:
        if not isinstance(d, dict):
            return None
        return _with_counts(cls(pinned=d.get("pinned") is True), d)

    @property
    def usage(self) -> float:
        return self.bytes_used / self.capacity_bytes if self.capacity_bytes > 0 else 0.0

    @property
    def note(self) -> str:
        return "pinned" if self.pinned else ""


@dataclass
class DiskTierNumbers:
    """The engine's KV disk tier (docs/kv_tiers.md), when it has one."""

    where = "on disk"

    files: int = 0
    bytes_used: int = 0
    capacity_bytes: int = 0
    blocks_written: int = 0
    blocks_read: int = 0
    blocks_unreadable: int = 0
    writes_dropped: int = 0
    writable: bool = True

    @classmethod
    def from_json(cls, d: Any) -> DiskTierNumbers | None:
        if not isinstance(d, dict):
            return None
        return _with_counts(cls(writable=d.get("writable") is not False), d)

    @property
    def usage(self) -> float:
        return self.bytes_used / self.capacity_bytes if self.capacity_bytes > 0 else 0.0

    @property
    def blocks(self) -> int:
        return self.files

    @property
    def note(self) -> str:
        return "" if self.writable else "writing off (see the server log)"


@dataclass
class EngineNumbers:
    """The engine block of the stats answer (mirrors engine.stats.EngineStats)."""

    num_blocks_total: int = 0
    num_blocks_used: int = 0
    num_blocks_cached: int = 0
    kv_cache_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    block_size: int = 16
    kv_cache_tokens: int = 0
    bytes_per_token: int = 0
    max_model_len: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    kv_tier_queries: int = 0
    kv_tier_hits: int = 0  # prompt tokens copied back from a tier instead of computed
    kv_host: HostTierNumbers | None = None
    kv_disk: DiskTierNumbers | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EngineNumbers:
        out = cls()
        for name, default in vars(cls()).items():
            if isinstance(default, float):
                setattr(out, name, _f(d, name, default))
            elif isinstance(default, int):
                setattr(out, name, int(_f(d, name, default)))
        out.kv_host = HostTierNumbers.from_json(d.get("kv_host"))
        out.kv_disk = DiskTierNumbers.from_json(d.get("kv_disk"))
        return out

    @property
    def draft_acceptance(self) -> float | None:
        """Share of speculation's draft tokens the model kept (None before any draft)."""
        if self.spec_decode_num_draft_tokens <= 0:
            return None
        return self.spec_decode_num_accepted_tokens / self.spec_decode_num_draft_tokens

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of looked-up prompt tokens found in the prefix cache (None before any query)."""
        if self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


@dataclass
class Rates:
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    preemptions_per_min: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rates:
        return cls(_f(d, "prompt_tokens_per_s"), _f(d, "generation_tokens_per_s"),
                   _f(d, "preemptions_per_min"))


@dataclass
class Latency:
    """Percentiles in seconds over the last `window_s`; None where there were no samples."""

    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    window_s: float = 60.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Latency:
        return cls(_opt(d, "ttft_p50"), _opt(d, "ttft_p99"), _opt(d, "itl_p50"),
                   _opt(d, "itl_p99"), _opt(d, "e2e_p50"), _opt(d, "e2e_p99"),
                   _f(d, "window_s", 60.0))


@dataclass
class ActiveThread:
    """One conversation the server counts as active; `cap` is None when the user has none."""

    user: str
    thread_key: str
    length: int
    turns: int
    cap: int | None = None
    last_seen: str | float | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ActiveThread:
        cap = d.get("cap")
        return cls(user=str(d.get("user") or "(anonymous)"), thread_key=str(d.get("thread_key", "")),
                   length=int(_f(d, "length")), turns=int(_f(d, "turns")),
                   cap=int(cap) if isinstance(cap, (int, float)) and cap > 0 else None,
                   last_seen=d.get("last_seen"))

    @property
    def fraction_of_cap(self) -> float | None:
        return None if not self.cap else self.length / self.cap


@dataclass
class UserShare:
    """One user's hold on the engine (/admin/stats' `users`): KV blocks held now, their share
    of the pool, running requests, preemptions since the server started."""

    user: str
    kv_blocks: int = 0
    kv_share: float = 0.0
    running: int = 0
    preemptions_total: int = 0
    kv_disk_bytes: int = 0  # their blocks in the KV disk tier

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UserShare:
        return cls(user=str(d.get("user") or "(anonymous)"), kv_blocks=int(_f(d, "kv_blocks")),
                   kv_share=_f(d, "kv_share"), running=int(_f(d, "running")),
                   preemptions_total=int(_f(d, "preemptions_total")),
                   kv_disk_bytes=int(_f(d, "kv_disk_bytes")))


@dataclass
class ModelStats:
    """One generate model in memory (/admin/stats' `models`, from servers with a model
    registry): its state and KV pool (None where the server does not say, e.g. asleep)."""

    name: str
    state: str = "ready"
    kv_cache_usage: float | None = None
    num_blocks_total: int | None = None
    num_blocks_used: int | None = None
    num_running: int = 0
    num_waiting: int = 0
    rates: Rates = field(default_factory=Rates)  # its own (a server before them: zeros)
    latency: Latency = field(default_factory=Latency)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelStats:
        total, used = _opt(d, "num_blocks_total"), _opt(d, "num_blocks_used")
        rates, latency = d.get("rates"), d.get("latency")
        return cls(name=str(d.get("name") or "(unnamed)"), state=str(d.get("state") or "ready"),
                   kv_cache_usage=_opt(d, "kv_cache_usage"),
                   num_blocks_total=None if total is None else int(total),
                   num_blocks_used=None if used is None else int(used),
                   num_running=int(_f(d, "num_running")), num_waiting=int(_f(d, "num_waiting")),
                   rates=Rates.from_json(rates if isinstance(rates, dict) else {}),
                   latency=Latency.from_json(latency if isinstance(latency, dict) else {}))


@dataclass(frozen=True)
class ModelNumbers:
    """What the dashboard's chart and rate and latency fields show for one model."""

    kv_cache_usage: float
    num_running: int
    num_waiting: int
    rates: Rates
    latency: Latency


def _models(value: Any) -> list[ModelStats]:
    """`models` as sent; an older server sends none, and anything but a list of objects
    reads as none too (the dashboard then shows the one gauge it always did)."""
    if not isinstance(value, list):
        return []
    return [ModelStats.from_json(m) for m in value if isinstance(m, dict)]


@dataclass
class StatsSnapshot:
    """One answer of `/admin/stats`, stamped with the console's own monotonic clock on arrival
    (the diagnosis rules compare snapshots by that clock, not by the server's)."""

    model: str = ""
    uptime_s: float = 0.0
    ready: bool = False
    state: str = "loading"  # loading, ready, sleeping (--sleep-idle-seconds), dead, stopped
    engine: EngineNumbers = field(default_factory=EngineNumbers)
    rates: Rates = field(default_factory=Rates)
    latency: Latency = field(default_factory=Latency)
    active_threads: list[ActiveThread] = field(default_factory=list)
    users: list[UserShare] = field(default_factory=list)  # the heaviest holder first
    structured_requests: dict[str, int] = field(default_factory=dict)  # by kind, since start
    models: list[ModelStats] = field(default_factory=list)  # each generate model in memory
    received: float = field(default_factory=time.monotonic)

    @property
    def started(self) -> bool:
        """The model has loaded (it may sleep since: the next request wakes it)."""
        return self.state in ("ready", "sleeping")

    @property
    def state_note(self) -> str:
        """What to add to the model's name: nothing when ready."""
        return {"ready": "", "sleeping": " — asleep (the next request wakes it)",
                "dead": " — failed (the server's log says why)",
                "stopped": " — stopping"}.get(self.state, " — loading…")

    def numbers_of(self, model: str | None) -> ModelNumbers | None:
        """`model`'s numbers in this snapshot: the default model's (the top-level ones) for
        None or its name; None for a model the snapshot does not list."""
        if not model or model == self.model:
            e = self.engine
            return ModelNumbers(e.kv_cache_usage, e.num_running, e.num_waiting, self.rates,
                                self.latency)
        m = next((m for m in self.models if m.name == model), None)
        if m is None:
            return None
        return ModelNumbers(m.kv_cache_usage or 0.0, m.num_running, m.num_waiting, m.rates,
                            m.latency)

    @classmethod
    def from_json(cls, d: dict[str, Any], received: float | None = None) -> StatsSnapshot:
        return cls(
            model=str(d.get("model", "")), uptime_s=_f(d, "uptime_s"), ready=bool(d.get("ready")),
            # An older server says only `ready`.
            state=str(d.get("state") or ("ready" if d.get("ready") else "loading")),
            engine=EngineNumbers.from_json(d.get("engine") or {}),
            rates=Rates.from_json(d.get("rates") or {}),
            latency=Latency.from_json(d.get("latency") or {}),
            active_threads=[ActiveThread.from_json(t) for t in d.get("active_threads") or []],
            users=sorted((UserShare.from_json(u) for u in d.get("users") or []),
                         key=lambda u: -u.kv_blocks),
            structured_requests={str(k): int(v) for k, v in
                                 (d.get("structured_requests") or {}).items()},
            models=_models(d.get("models")),
            received=time.monotonic() if received is None else received,
        )

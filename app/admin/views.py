"""The JSON shapes of docs/admin_api.md (pydantic, so /openapi.json shows them), built from the
data layer's records. Times are ISO 8601 strings, as the records' isoformat() writes them."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, Field

from officellm.app.db import EventInfo, KeyInfo, ThreadInfo, UsageDay, UsageReportRow, UserInfo
from officellm.app.db.policies import StoredPolicy
from officellm.app.db.records import IssuedKey
from officellm.app.db.records import UsageCounts as UsageCountsRecord
from officellm.app.policy.types import EffectivePolicy
from officellm.engine import DiskTierStats, EngineStats, HostTierStats, KVPlan

Timestamp = str  # ISO 8601, e.g. 2025-01-11T09:00:00+00:00


def iso(value: datetime | date | None) -> str | None:
    return value.isoformat() if value is not None else None


def _iso(value: datetime | date) -> str:
    return value.isoformat()


class UsageCounts(BaseModel):
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UserView(BaseModel):
    id: int
    name: str
    disabled: bool
    created: Timestamp
    usage_today: UsageCounts
    via: str | None = Field(
        description="The front end this person came through (its user's name), e.g. "
                    "'open-webui'; null for everyone else.")


class KeyView(BaseModel):
    id: int
    prefix: str
    user: str
    created: Timestamp
    last_used: Timestamp | None
    revoked: bool
    forwarded_users: bool = Field(description="A front-end key: it speaks for other people.")
    jwt_secret: bool = Field(description="Its people come in JWTs checked with a secret "
                                         "(never shown).")


class IssuedKeyView(BaseModel):
    """POST /admin/keys: the raw key is in this one answer and nowhere else."""

    key: str
    id: int
    prefix: str
    user: str
    forwarded_users: bool
    jwt_secret: bool


class PolicyView(BaseModel):
    """A policy's fields. In the default row null means no limit; in a user's, inherit."""

    max_context_tokens: int | None
    max_turns: int | None
    on_limit: str | None
    max_concurrent_requests: int | None
    max_tokens_per_day: int | None
    audio_minutes_per_day: int | None = Field(None, description="Minutes of audio a day the "
                                              "speech-to-text routes may read; null: no limit "
                                              "(default) or inherit (user's).")
    share_prefix_cache: bool | None
    priority: str | None = Field(description="low | normal | high: the user's weight under the "
                                             "fair scheduler (0.5, 1, 2).")
    max_kv_share: float | None = Field(description="Share of the KV pool (0-1] above which the "
                                                   "user's prompts wait while others have "
                                                   "work; null: no cap.")
    models: list[str] | None = Field(description="The registered models' names the user may "
                                                 "use; null: every model (in the default) or "
                                                 "inherit (in a user's).")


class PolicyList(BaseModel):
    default: PolicyView
    users: dict[str, PolicyView] = Field(description="Each user's override, by name.")


class ThreadView(BaseModel):
    user: str
    thread_key: str
    turns: int
    length: int
    last_prompt_tokens: int
    last_completion_tokens: int
    first_seen: Timestamp
    last_seen: Timestamp
    cap: int | None = Field(description="The owner's effective context cap (tokens).")


class ActiveThread(BaseModel):
    """A thread seen in the last few minutes, as /admin/stats lists it."""

    user: str
    thread_key: str
    length: int
    turns: int
    cap: int | None
    last_seen: Timestamp


class UsageTotals(BaseModel):
    """Counters of GET /admin/usage (docs/admin_api.md): requests and tokens include the
    embeddings and background tasks also counted apart."""

    requests: int
    prompt_tokens: int
    cached_tokens: int = Field(description="Of prompt_tokens, those found in the prefix cache.")
    completion_tokens: int
    embedding_requests: int
    embedding_tokens: int
    task_requests: int = Field(description="Front ends' background tasks (titles, tags, "
                                           "follow-ups).")
    task_tokens: int
    busy_seconds: float = Field(description="Seconds from the engine (or encoder) taking each "
                                            "request to its end, summed.")
    images: int = Field(0, description="Images in chat requests (their tokens are in "
                                       "prompt_tokens).")
    audio_requests: int = Field(0, description="Transcriptions and translations.")
    audio_seconds: float = Field(0.0, description="Seconds of audio transcribed or translated.")
    rerank_requests: int = Field(0, description="Rerank and score requests.")
    rerank_tokens: int = 0


class UsageRow(UsageTotals):
    """One group of a usage report: `user`, `model` or `day` names it (the others null)."""

    user: str | None
    model: str | None = Field(description="The served model's name; '' for usage counted "
                                          "before per-model usage (migration 0011).")
    day: str | None = Field(description="The UTC day, e.g. 2025-01-11.")


class UsageReport(BaseModel):
    """GET /admin/usage: the UTC days `since` to `until`, grouped `by`, and their total."""

    since: str
    until: str
    by: str
    rows: list[UsageRow]
    total: UsageTotals


class EventView(BaseModel):
    time: Timestamp
    kind: str
    user: str | None
    detail: Any


class UserShareView(BaseModel):
    """One user's hold on the engine (app/observability/sharing.py)."""

    user: str
    kv_blocks: int = Field(description="KV blocks in their requests' block tables now.")
    kv_share: float = Field(description="kv_blocks over the whole pool (0-1).")
    running: int = Field(description="Their requests in the running batch.")
    preemptions_total: int = Field(description="Preemptions of their requests since start.")
    kv_disk_bytes: int = Field(0, description="Their blocks in the KV disk tier (0 without "
                                              "one, or while their policy shares the cache).")


class EmbeddingStats(BaseModel):
    """The embedding model's (--embedding-model) totals since start."""

    model: str
    state: str = Field(description="loading, ready, dead or stopped.")
    requests: int
    inputs: int = Field(description="Inputs embedded.")
    tokens: int = Field(description="Their tokens.")
    batches: int = Field(description="Forward passes: fewer than inputs when concurrent "
                                     "requests' inputs were encoded together.")


class ModelStats(BaseModel):
    """One served generate model's state and KV pool (the console's gauge per model)."""

    name: str
    state: str = Field(description="unloaded, loading, ready, sleeping, failed or stopped.")
    kv_cache_usage: float | None = Field(description="null while out of memory.")
    num_blocks_total: int | None
    num_blocks_used: int | None
    num_running: int
    num_waiting: int
    kv_host: HostTierStats | None = Field(
        None, description="The model's KV host tier in RAM (docs/kv_tiers.md); null without "
                          "one or while out of memory.")
    kv_disk: DiskTierStats | None = Field(
        None, description="The model's KV disk tier (docs/kv_tiers.md); null without one or "
                          "while out of memory.")
    kv_tier_hits: int = Field(0, description="Prompt tokens copied back from its RAM or disk "
                                             "tier instead of computed, since the model "
                                             "loaded.")
    rates: dict[str, float] = Field(
        default_factory=dict, description="The model's own rates, as Stats.rates.")
    latency: dict[str, float | None] = Field(
        default_factory=dict, description="The model's own latencies, as Stats.latency.")


class Stats(BaseModel):
    """GET /admin/stats: live numbers (also while the model loads, or after it failed)."""

    model: str | None = Field(description="The default model's name; null until it has "
                                          "loaded. `state`, `engine`, `rates`, `latency`, "
                                          "`users` and the threads' caps are the default "
                                          "model's; `models` has every served model, each "
                                          "with its own rates and latency.")
    uptime_s: float
    ready: bool
    state: str = Field("ready", description="The model's lifecycle: loading, ready, sleeping "
                                            "(--sleep-idle-seconds), dead or stopped.")
    engine: EngineStats | None = Field(description="null until the engine has loaded, and "
                                                   "while it sleeps.")
    rates: dict[str, float] = Field(
        description="The default model's prompt_tokens_per_s, generation_tokens_per_s, "
                    "preemptions_per_min (each model's: `models`).")
    latency: dict[str, float | None] = Field(
        description="The default model's p50 and p99 (seconds) of ttft, itl and e2e over the "
                    "last window_s (each model's: `models`).")
    active_threads: list[ActiveThread]
    users: list[UserShareView] = Field(
        description="Who holds the engine: per user holding blocks, running or ever "
                    "preempted, the heaviest holder first.")
    structured_requests: dict[str, int] = Field(
        default_factory=dict,
        description="Requests since start whose output a grammar or a tool-call parser shaped, "
                    "by kind (json_schema, json_object, regex, choice, grammar, tool_required, "
                    "tool_named, tool_auto).")
    embeddings: EmbeddingStats | None = Field(
        None, description="The embedding model's totals; null when none is served.")
    models: list[ModelStats] = Field(
        default_factory=list, description="Every served generate model, the default first.")


class Plan(BaseModel):
    """GET /admin/plan: the KV arithmetic for the loaded model."""

    model: str | None
    bytes_per_token: int
    kv_cache_dtype: str = Field(description="The KV cache's storage dtype (--kv-cache-dtype "
                                            "resolved), which bytes_per_token counts.")
    kv_cache_tokens: int
    kv_cache_bytes: int
    num_blocks: int
    block_size: int
    max_model_len: int
    avg_thread_tokens: int | None
    threads_at_avg: float | None
    threads_at_cap: float | None
    threads_at_max_len: float | None
    cap: int | None


class WhatIfPlan(BaseModel):
    """POST /admin/plan: the KV arithmetic for a model and memory budget of the asker's choice."""

    plan: KVPlan = Field(description="`officellm plan --json`'s object.")
    text: str = Field(description="The report `officellm plan` prints for the same question.")


def usage_counts(day: UsageDay | None) -> UsageCounts:
    if day is None:
        return UsageCounts(requests=0, prompt_tokens=0, completion_tokens=0)
    return UsageCounts(requests=day.requests, prompt_tokens=day.prompt_tokens,
                       completion_tokens=day.completion_tokens)


def user_view(user: UserInfo, today: UsageDay | None) -> UserView:
    return UserView(id=user.id, name=user.name, disabled=user.disabled, created=_iso(user.created),
                    usage_today=usage_counts(today), via=user.via)


def key_view(key: KeyInfo) -> KeyView:
    return KeyView(id=key.id, prefix=key.prefix, user=key.user_name, created=_iso(key.created),
                   last_used=iso(key.last_used), revoked=key.revoked,
                   forwarded_users=key.forwarded_users, jwt_secret=key.jwt_secret)


def issued_key_view(issued: IssuedKey) -> IssuedKeyView:
    return IssuedKeyView(key=issued.raw, id=issued.info.id, prefix=issued.info.prefix,
                         user=issued.info.user_name, forwarded_users=issued.info.forwarded_users,
                         jwt_secret=issued.info.jwt_secret)


def policy_view(policy: StoredPolicy | EffectivePolicy) -> PolicyView:
    return PolicyView(**{k: getattr(policy, k) for k in PolicyView.model_fields})


def thread_view(t: ThreadInfo, cap: int | None) -> ThreadView:
    return ThreadView(user=t.user_name, thread_key=t.thread_key, turns=t.turns, length=t.length,
                      last_prompt_tokens=t.last_prompt_tokens,
                      last_completion_tokens=t.last_completion_tokens,
                      first_seen=_iso(t.first_seen), last_seen=_iso(t.last_seen), cap=cap)


def usage_row_view(r: UsageReportRow) -> UsageRow:
    return UsageRow(user=r.user, model=r.model, day=iso(r.day), **r.counts.to_dict())


def usage_report_view(since: date, until: date, by: str, rows: list[UsageReportRow],
                      total: UsageCountsRecord) -> UsageReport:
    return UsageReport(since=_iso(since), until=_iso(until), by=by,
                       rows=[usage_row_view(r) for r in rows],
                       total=UsageTotals(**total.to_dict()))


def event_view(e: EventInfo, user_name: str | None) -> EventView:
    return EventView(time=_iso(e.time), kind=e.kind, user=user_name, detail=e.detail)

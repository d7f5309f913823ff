"""The admin API's shapes (docs/admin_api.md) on the live server: stats, plan, users, keys,
usage and events, with numbers that agree with what the requests did."""

from __future__ import annotations

import openai

from tests.policy.helpers import Office, chat, metric

MODEL = "SmolLM2-135M-Instruct.Q4_1"
POLICY = {"max_context_tokens", "max_turns", "on_limit", "max_concurrent_requests",
          "max_tokens_per_day", "audio_minutes_per_day", "share_prefix_cache", "priority",
          "max_kv_share", "models"}


def test_stats_and_plan(office: Office, uniq) -> None:
    admin = office.admin
    user = f"stats-{uniq}"
    key = admin.user_with_key(user, max_context_tokens=1000)
    client: openai.OpenAI = office.client(key)
    r = client.chat.completions.create(model=MODEL, messages=chat(2, tag=uniq), max_tokens=5,
                                       temperature=0, extra_body={"ignore_eos": True})
    stats = admin.get("/stats")
    assert stats["model"] == MODEL and stats["ready"] is True and stats["uptime_s"] > 0
    engine = stats["engine"]
    for field in ("num_blocks_total", "num_blocks_used", "num_blocks_cached", "kv_cache_usage",
                  "num_running", "num_waiting", "num_preemptions_total", "prefix_cache_queries",
                  "prefix_cache_hits", "prompt_tokens_total", "generation_tokens_total",
                  "block_size", "kv_cache_tokens", "bytes_per_token", "max_model_len"):
        assert isinstance(engine[field], (int, float)), field
    assert engine["kv_cache_tokens"] == engine["num_blocks_total"] * engine["block_size"]
    assert set(stats["rates"]) == {"prompt_tokens_per_s", "generation_tokens_per_s",
                                   "preemptions_per_min"}
    latency = stats["latency"]
    assert latency["window_s"] == 60
    assert 0 < latency["ttft_p50"] <= latency["ttft_p99"]
    assert 0 < latency["itl_p50"] <= latency["itl_p99"]
    assert latency["e2e_p50"] > 0
    mine = [t for t in stats["active_threads"] if t["user"] == user]
    assert len(mine) == 1
    assert set(mine[0]) == {"user", "thread_key", "length", "turns", "cap", "last_seen"}
    assert mine[0]["length"] == r.usage.total_tokens and mine[0]["turns"] == 2
    assert mine[0]["cap"] == 1000
    m = office.metrics(key)
    assert metric(m, "officellm:active_threads", user=user) == 1
    assert metric(m, "officellm:requests_total", user=user) == 1
    assert metric(m, "officellm:prompt_tokens_total", user=user) == r.usage.prompt_tokens

    plan = admin.get("/plan")
    assert plan["model"] == MODEL
    assert plan["kv_cache_tokens"] == plan["num_blocks"] * plan["block_size"]
    assert plan["kv_cache_tokens"] == engine["kv_cache_tokens"]
    assert plan["bytes_per_token"] == engine["bytes_per_token"] > 0
    assert plan["max_model_len"] == engine["max_model_len"]
    assert plan["avg_thread_tokens"] > 0
    # A thread holds whole blocks: N tokens take ceil(N / block_size) of the pool's blocks.
    def threads_of(tokens: int) -> float:
        return plan["num_blocks"] / -(-tokens // plan["block_size"])

    assert abs(plan["threads_at_avg"] - threads_of(plan["avg_thread_tokens"])) < 0.01
    assert plan["cap"] == min(16384, plan["max_model_len"])  # default policy: no cap of its own
    assert abs(plan["threads_at_cap"] - threads_of(plan["cap"])) < 0.01
    assert abs(plan["threads_at_max_len"] - threads_of(plan["max_model_len"])) < 0.01
    assert plan["kv_cache_bytes"] == plan["kv_cache_tokens"] * plan["bytes_per_token"]


def test_users_keys_usage_events_shapes(office: Office, uniq) -> None:
    admin = office.admin
    user = f"shape-{uniq}"
    created = admin.request("POST", "/users", json={"name": user}, expect=201)
    assert set(created) == {"id", "name", "disabled", "created", "usage_today", "via"}
    assert created["via"] is None  # nobody's forwarded person
    issued = admin.request("POST", "/keys", json={"user": user}, expect=201)
    assert set(issued) == {"key", "id", "prefix", "user", "forwarded_users", "jwt_secret"}
    assert issued["key"].startswith("ocl-")
    assert (issued["forwarded_users"], issued["jwt_secret"]) == (False, False)
    r = office.client(issued["key"]).completions.create(model=MODEL, prompt="One, two,",
                                                        max_tokens=2)
    (key,) = admin.get(f"/keys?user={user}")
    assert set(key) == {"id", "prefix", "user", "created", "last_used", "revoked",
                        "forwarded_users", "jwt_secret"}
    assert key["id"] == issued["id"] and key["last_used"] is not None
    report = admin.get("/usage?days=2")
    assert set(report) == {"since", "until", "by", "rows", "total"}
    (row,) = [u for u in report["rows"] if u["user"] == user]
    assert set(row) == {"user", "model", "day", "requests", "prompt_tokens", "cached_tokens",
                        "completion_tokens", "embedding_requests", "embedding_tokens",
                        "task_requests", "task_tokens", "busy_seconds", "images",
                        "audio_requests", "audio_seconds", "rerank_requests", "rerank_tokens"}
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        1, r.usage.prompt_tokens, r.usage.completion_tokens)
    assert admin.get(f"/threads?user={user}") == []  # completions have no threads
    events = admin.get("/events?limit=500")
    assert events == sorted(events, key=lambda e: e["time"], reverse=True)
    kinds = {e["kind"] for e in events if e["user"] == user}
    assert {"user_created", "key_issued"} <= kinds
    assert set(events[0]) == {"time", "kind", "user", "detail"}
    policies = admin.get("/policies")
    assert set(policies["default"]) == POLICY
    assert admin.get("/events?limit=1&kind=key_issued")[0]["kind"] == "key_issued"

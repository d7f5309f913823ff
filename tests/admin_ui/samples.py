"""JSON shaped exactly like docs/admin_api.md's answers, for the tests of the pure parts."""

from __future__ import annotations

from typing import Any


def stats_json(*, usage: float = 0.0, running: int = 0, waiting: int = 0, preemptions: int = 0,
               prompt_tokens: int = 0, gen_tokens: int = 0, uptime: float = 10.0,
               itl: tuple[float | None, float | None] = (None, None),
               ttft: tuple[float | None, float | None] = (None, None),
               threads: list[dict[str, Any]] | None = None, blocks_total: int = 100,
               queries: int = 0, hits: int = 0,
               users: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "SmolLM2-135M-Instruct.Q4_1", "uptime_s": uptime, "ready": True,
        "engine": {
            "num_blocks_total": blocks_total, "num_blocks_used": round(usage * blocks_total),
            "num_blocks_cached": 3, "kv_cache_usage": usage, "num_running": running,
            "num_waiting": waiting, "num_preemptions_total": preemptions,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "prompt_tokens_total": prompt_tokens, "generation_tokens_total": gen_tokens,
            "block_size": 16, "kv_cache_tokens": blocks_total * 16, "bytes_per_token": 46080,
            "max_model_len": 1024,
        },
        "rates": {"prompt_tokens_per_s": 12.5, "generation_tokens_per_s": 40.0,
                  "preemptions_per_min": 0.0},
        "latency": {"ttft_p50": ttft[0], "ttft_p99": ttft[1], "itl_p50": itl[0],
                    "itl_p99": itl[1], "e2e_p50": None, "e2e_p99": None, "window_s": 60},
        "active_threads": threads or [],
        "users": users or [],
    }


def user_json(user: str, blocks: int, share: float, running: int,
              preempted: int = 0) -> dict[str, Any]:
    return {"user": user, "kv_blocks": blocks, "kv_share": share, "running": running,
            "preemptions_total": preempted}


def thread_json(user: str, key: str, length: int, turns: int, cap: int | None) -> dict[str, Any]:
    return {"user": user, "thread_key": key, "length": length, "turns": turns, "cap": cap,
            "last_seen": "2026-11-30T10:00:00"}

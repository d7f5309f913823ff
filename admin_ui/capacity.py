"""The Capacity tab's arithmetic (docs/design.md §4): how many threads of a given length fit.

The server's `GET /admin/plan` answers for the loaded model; when a server predates that
route the same numbers are derived from `/admin/stats` (bytes per token and pool size are in
its engine block) and the active threads. A thread holds whole KV blocks, so the count of
threads that fit is blocks-based, the way the engine allocates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from admin_ui.snapshot import ActiveThread, EngineNumbers


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks a thread of `tokens` tokens holds (at least one)."""
    return max(1, -(-max(0, tokens) // max(1, block_size)))


def threads_that_fit(num_blocks: int, tokens: int, block_size: int) -> int:
    """Whole threads of `tokens` tokens the pool can hold at once."""
    if tokens <= 0:
        return 0
    return num_blocks // blocks_for(tokens, block_size)


@dataclass
class Capacity:
    model: str
    bytes_per_token: int
    block_size: int
    num_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    avg_thread_tokens: int  # 0 when no thread was seen today
    # How many threads fit at once: pool tokens over thread tokens, like vLLM's "Maximum
    # concurrency: 6.03x" (the server's /admin/plan answers with such ratios).
    threads_at_avg: float
    cap: int | None  # the default policy's max_context_tokens, None = no cap
    threads_at_cap: float | None
    threads_at_max_len: float

    @property
    def pool_bytes(self) -> int:
        return self.kv_cache_tokens * self.bytes_per_token


def capacity_from_plan(plan: dict[str, Any]) -> Capacity:
    """The server's own answer (`GET /admin/plan`), completed where a field is missing."""
    bs = int(plan.get("block_size") or 16)
    tokens = int(plan.get("kv_cache_tokens") or 0)
    blocks = int(plan.get("num_blocks") or tokens // bs)
    mml = int(plan.get("max_model_len") or 0)
    avg = int(round(plan.get("avg_thread_tokens") or 0))
    cap = plan.get("cap")
    cap = int(cap) if isinstance(cap, (int, float)) and cap > 0 else None
    at_avg = plan.get("threads_at_avg")
    at_cap = plan.get("threads_at_cap")
    return Capacity(
        model=str(plan.get("model", "")), bytes_per_token=int(plan.get("bytes_per_token") or 0),
        block_size=bs, num_blocks=blocks, kv_cache_tokens=tokens, max_model_len=mml,
        avg_thread_tokens=avg,
        threads_at_avg=float(at_avg) if at_avg is not None else threads_that_fit(blocks, avg, bs),
        cap=cap,
        threads_at_cap=(float(at_cap) if at_cap is not None
                        else threads_that_fit(blocks, cap, bs) if cap else None),
        threads_at_max_len=threads_that_fit(blocks, mml, bs),
    )


def capacity_from_stats(model: str, engine: EngineNumbers, threads: Sequence[ActiveThread],
                        cap: int | None) -> Capacity:
    """The same numbers from the live stats, averaging over the threads seen."""
    bs = engine.block_size or 16
    blocks = engine.num_blocks_total or engine.kv_cache_tokens // bs
    avg = round(sum(t.length for t in threads) / len(threads)) if threads else 0
    return Capacity(
        model=model, bytes_per_token=engine.bytes_per_token, block_size=bs, num_blocks=blocks,
        kv_cache_tokens=engine.kv_cache_tokens or blocks * bs,
        max_model_len=engine.max_model_len, avg_thread_tokens=avg,
        threads_at_avg=threads_that_fit(blocks, avg, bs), cap=cap,
        threads_at_cap=threads_that_fit(blocks, cap, bs) if cap else None,
        threads_at_max_len=threads_that_fit(blocks, engine.max_model_len, bs),
    )


def what_if(model: str, memory: str, dtype: str = "bf16", max_model_len: int | None = None,
            avg_tokens: int = 4000):
    """`officellm plan` for another model or memory size (engine.kv_plan; imported lazily
    because the engine package pulls in torch, which the console does not otherwise need)."""
    from engine.config import parse_memory
    from engine.kv_plan import load_spec, make_plan

    spec, name = load_spec(model)
    return make_plan(spec, name, parse_memory(memory), dtype, max_model_len, avg_tokens)

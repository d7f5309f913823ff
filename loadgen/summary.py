"""A bench run's summary numbers: latency distributions, throughput, ITL around pastes and
the throughput timeline. Percentiles are app/percentiles.py's, the definition the
server's /admin/stats uses too."""

from __future__ import annotations

import math
from typing import Any

from officellm.app.percentiles import percentile
from officellm.loadgen.client import RequestRecord


def describe(values: list[float]) -> dict[str, Any]:
    """count, mean, p50, p90, p99, max, in the values' unit; None fields when empty."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {"count": len(values), "mean": sum(values) / len(values),
            "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values)}


def summarize(records: list[RequestRecord], wall: float) -> dict[str, Any]:
    """Latency distributions over successful requests; throughput over the run's wall time."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    wall = max(wall, 1e-9)
    return {
        "requests": {"sent": len(records), "completed": len(ok), "errors": len(records) - len(ok)},
        "errors": sorted({r.error for r in records if r.error})[:10],
        "wall_s": wall,
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / wall,
        "total_tok_per_s": (out_tokens + prompt_tokens) / wall,
        "req_per_s": len(ok) / wall,
        "ttft_s": describe([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": describe([g for r in ok for g in r.itls]),
        "tpot_s": describe([t for r in ok if (t := r.tpot) is not None]),
        "e2e_s": describe([r.e2e for r in ok if r.e2e is not None]),
    }


def noisy_neighbour(records: list[RequestRecord], wall: float) -> dict[str, Any]:
    """The light users' latencies (their chats) and the heavy user's throughput: every token
    its requests had processed (prompt and output, mostly prompt: it sends documents) per
    second of the run's wall time."""
    light = [r for r in records if r.kind == "chat"]
    heavy = [r for r in records if r.kind == "heavy"]
    h = summarize(heavy, wall)
    return {"light": summarize(light, wall),
            "heavy": {**h, "throughput_tok_per_s": h["total_tok_per_s"]}}


def paste_windows(records: list[RequestRecord]) -> list[tuple[float, float]]:
    """The prefill of each pasted document: from sending it to its first token (or its end)."""
    out = []
    for r in records:
        if r.kind == "paste":
            end = r.first_token or r.end
            if end is not None:
                out.append((r.start, end))
    return out


def itl_around_pastes(records: list[RequestRecord]) -> dict[str, Any]:
    """The chatting users' ITL during a paste's prefill vs the rest of the time, and the
    time to first token of the chats that waited while a paste was prefilled.

    A gap counts as "during" when it overlaps a prefill window: that is the stall a user sees.
    The TTFT is the stall ITL cannot see: a chat held back until the paste is done streams
    no gaps during it at all.
    """
    windows = paste_windows(records)
    during: list[float] = []
    without: list[float] = []
    ttft_during: list[float] = []
    for r in records:
        if r.kind != "chat" or not r.ok:
            continue
        if r.first_token is not None and any(r.start < w1 and r.first_token > w0
                                             for w0, w1 in windows):
            ttft_during.append(r.first_token - r.start)
        t = r.chunk_times
        for a, b in zip(t, t[1:]):
            hit = any(a < w1 and b > w0 for w0, w1 in windows)
            (during if hit else without).append(b - a)
    d, w = describe(during), describe(without)
    ratio = d["p99"] / w["p50"] if d["p99"] is not None and w["p50"] else None
    return {"paste_windows_s": [w1 - w0 for w0, w1 in windows], "itl_during_paste_s": d,
            "itl_without_paste_s": w, "p99_during_over_p50_without": ratio,
            "chat_ttft_during_paste_s": describe(ttft_during)}


def timeline(records: list[RequestRecord], t0: float, wall: float,
             bin_s: float = 1.0) -> list[dict[str, float]]:
    """Output tokens per second in bins; a request's usage count is spread over its chunks
    (a chunk may carry more than one token)."""
    n = max(1, math.ceil(wall / bin_s))
    tokens = [0.0] * n
    for r in records:
        if not r.ok or not r.chunk_times:
            continue
        per_chunk = (r.completion_tokens or 0) / len(r.chunk_times)
        for t in r.chunk_times:
            tokens[min(n - 1, max(0, int((t - t0) / bin_s)))] += per_chunk
    return [{"t_s": i * bin_s, "output_tok_per_s": v / bin_s} for i, v in enumerate(tokens)]

"""The server's own counters from /metrics (Prometheus text), read before and after a run.

vLLM's names, which officellm exports too; a server without them (llama.cpp) gives None.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "prompt_tokens_computed": "officellm:prompt_tokens_computed_total",
    "disk_hits": "vllm:external_prefix_cache_hits_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}


def parse_counters(body: str) -> dict[str, float]:
    """Sum each known counter over its labels (one model, but several names are possible)."""
    wanted = {v: k for k, v in COUNTERS.items()}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


async def scrape(http: httpx.AsyncClient) -> dict[str, float] | None:
    """None when the server has no /metrics or it is not Prometheus text."""
    try:
        resp = await http.get("/metrics", timeout=10.0)
        if resp.status_code != 200:
            return None
        return parse_counters(resp.text)
    except (httpx.HTTPError, ValueError):
        return None


def deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """What the run added to each counter, and the prefix-cache hit rate over the run."""
    out: dict[str, Any] = {"before": before, "after": after}
    for key in COUNTERS:
        if before is not None and after is not None and key in before and key in after:
            out[key] = after[key] - before[key]
        else:
            out[key] = None
    hits, queries = out["prefix_cache_hits"], out["prefix_cache_queries"]
    out["prefix_cache_hit_rate"] = (hits / queries) if hits is not None and queries else None
    return out

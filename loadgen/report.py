"""The JSON document of a run: settings, summary, server counters, and every request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from officellm.loadgen import server_metrics, summary
from officellm.loadgen.runner import BenchResult

SCHEMA = "officellm-bench/1"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def request_dict(rec: Any, t0: float) -> dict[str, Any]:
    """One request, times relative to the run's start (seconds)."""
    return {"user": rec.user, "conversation": rec.conversation, "turn": rec.turn,
            "kind": rec.kind, "start_s": _r(rec.start - t0), "max_tokens": rec.max_tokens,
            "ttft_s": _r(rec.ttft), "e2e_s": _r(rec.e2e), "tpot_s": _r(rec.tpot),
            "prompt_tokens": rec.prompt_tokens, "completion_tokens": rec.completion_tokens,
            "chunks": len(rec.chunk_times),
            "chunk_times_s": [_r(t - t0) for t in rec.chunk_times], "error": rec.error}


def build(result: BenchResult) -> dict[str, Any]:
    cfg = result.config
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": cfg.name,
        "settings": {"users": cfg.users, "seed": cfg.seed, "requests": result.requests_limit,
                     "duration_s": result.duration_limit, "max_tokens": cfg.max_tokens,
                     "think_time_s": cfg.think_time, "max_context": cfg.max_context,
                     "doc_tokens": cfg.effective_doc_tokens() if cfg.name == "long-doc" else None,
                     "prefix_tokens": cfg.prefix_tokens if cfg.name == "shared-prefix" else None,
                     **({"heavy_requests": cfg.heavy_requests,
                         "heavy_doc_tokens": cfg.effective_heavy_doc_tokens(),
                         "heavy_max_tokens": cfg.heavy_max_tokens,
                         "heavy_start_s": cfg.heavy_start}
                        if cfg.name == "noisy-neighbour" else {}),
                     "extra_body": result.target.extra_body},
        "server": {"base_url": result.target.base_url, "model": result.model,
                   "max_context": result.server_max_context},
        "summary": summary.summarize(result.records, result.wall),
        "server_metrics": server_metrics.deltas(result.metrics_before, result.metrics_after),
        "timeline": summary.timeline(result.records, result.t0, result.wall),
        "requests": [request_dict(r, result.t0) for r in result.records],
    }
    if cfg.name == "long-doc":
        doc["long_doc"] = summary.itl_around_pastes(result.records)
    if cfg.name == "noisy-neighbour":
        doc["noisy_neighbour"] = summary.noisy_neighbour(result.records, result.wall)
    return doc


def write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def text_summary(doc: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    s, m = doc["summary"], doc["server_metrics"]
    lines = [f"{doc['scenario']}: {s['requests']['completed']}/{s['requests']['sent']} requests "
             f"in {s['wall_s']:.1f} s, {s['requests']['errors']} errors",
             f"  output {s['output_tok_per_s']:.1f} tok/s, total {s['total_tok_per_s']:.1f} "
             f"tok/s, {s['req_per_s']:.2f} req/s",
             "  ms          mean   p50   p90   p99"]
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        d = s[key]
        lines.append(f"  {key[:-2]:<10}" + "".join(f"{_ms(d[q]):>6}"
                                                   for q in ("mean", "p50", "p90", "p99")))
    if m["preemptions"] is not None:
        rate = m["prefix_cache_hit_rate"]
        lines.append(f"  server: {m['preemptions']:.0f} preemptions, prefix-cache hit rate "
                     + ("-" if rate is None else f"{rate:.1%}")
                     + ("" if m.get("prompt_tokens_computed") is None else
                        f", prompt tokens computed {m['prompt_tokens_computed']:.0f}")
                     + ("" if not m.get("disk_hits") else
                        f", read from disk {m['disk_hits']:.0f}"))
    if "long_doc" in doc:
        ld = doc["long_doc"]
        lines.append(f"  long-doc: chat ITL p99 during paste {_ms(ld['itl_during_paste_s']['p99'])}"
                     f" ms vs p50 without {_ms(ld['itl_without_paste_s']['p50'])} ms; chat TTFT"
                     f" p99 during paste {_ms(ld['chat_ttft_during_paste_s']['p99'])} ms")
    if "noisy_neighbour" in doc:
        nn = doc["noisy_neighbour"]
        light, heavy = nn["light"], nn["heavy"]
        lines.append(f"  light users: TTFT p50/p99 {_ms(light['ttft_s']['p50'])}/"
                     f"{_ms(light['ttft_s']['p99'])} ms, ITL p50/p99 "
                     f"{_ms(light['itl_s']['p50'])}/{_ms(light['itl_s']['p99'])} ms "
                     f"({light['requests']['completed']} requests)")
        lines.append(f"  heavy user: {heavy['throughput_tok_per_s']:.1f} tok/s processed "
                     f"({heavy['requests']['completed']} requests)")
    return "\n".join(lines)

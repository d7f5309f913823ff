"""(f) The KV tiers below the device's pool (docs/kv_tiers.md): on random Qwen2.5-0.5B-shaped
weights in float32, a pool too small for a batch of long prompts, so sequences preempt each
other and prefixes are evicted; with a host tier in (pinned) RAM and a disk tier under it the
greedy tokens must equal the same engine's without tiers, while blocks are copied back from
both. Also times one prefix copied back from RAM against computing it.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpucheck.models import (
    build_engine,
    free_cuda,
    hf_config,
    random_hf_model,
    random_prompts,
    write_model_dir,
)
from benchmarks.gpucheck.parity import _engine_greedy


def _prefix_ttft(engine, prompt: list[int]) -> float:
    """Seconds to the first token of one request run alone."""
    from officellm.engine.frontend.sampling_params import SamplingParams

    start = time.perf_counter()
    engine.add_request(f"t{start}", prompt, SamplingParams(temperature=0, max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def run(device: torch.device, smoke: bool) -> dict:
    t0 = time.perf_counter()
    cfg = hf_config("Qwen2.5-0.5B-Instruct", smoke)
    n, plen, max_new = (4, 40, 24) if smoke else (16, 1500, 200)
    prompts = random_prompts(n, plen, cfg.vocab_size, seed=2)
    hf = random_hf_model(cfg, torch.float32, device)
    # Room for every prompt and a block more, not for their outputs: the sequences preempt
    # each other as they grow, and prefixes are evicted.
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * 4
    pool = per_token * 16 * (n * -(-(plen + 1) // 16) + 1)
    base = dict(device=device.type, dtype="float32", kv_cache_dtype="float32",
                kv_cache_memory=pool, max_model_len=plen + max_new + 16, max_num_seqs=n)
    report: dict = {"model": "Qwen2.5-0.5B-shaped, random weights, float32", "prompts": n,
                    "prompt_tokens": plen, "new_tokens": max_new, "pool_bytes": pool}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(cfg, Path(tmp) / "qwen-0.5b")
        plain = build_engine(hf, model_dir, **base)
        expected = _engine_greedy(plain, prompts, max_new)
        plain_stats = plain.stats()
        del plain
        free_cuda()
        tiered = build_engine(hf, model_dir, **base, kv_offloading_size=4 * pool,
                              kv_disk_dir=str(Path(tmp) / "kv"), kv_disk_key=bytes(32))
        ours = _engine_greedy(tiered, prompts, max_new)
        stats = tiered.stats()
        # One prefix evicted from the pool by the others, then sent again: from RAM.
        computed = _prefix_ttft(tiered, prompts[0] + [7])
        for other in prompts[1:]:
            _prefix_ttft(tiered, other + [7])
        before = tiered.stats().kv_host
        copied = _prefix_ttft(tiered, prompts[0] + [7])
        after = tiered.stats().kv_host
        del tiered
    free_cuda()
    report.update({
        "identical": ours == expected,
        "preemptions_without_tiers": plain_stats.num_preemptions_total,
        "preemptions_with_tiers": stats.num_preemptions_total,
        "prompt_tokens_computed_without": plain_stats.prompt_tokens_computed_total,
        "prompt_tokens_computed_with": stats.prompt_tokens_computed_total,
        "tier_hit_tokens": stats.kv_tier_hits,
        "host": asdict(stats.kv_host) if stats.kv_host is not None else None,
        "prefix_computed_s": computed,
        "prefix_from_ram_s": copied,
        "blocks_from_ram": (after.blocks_read - before.blocks_read
                            if after is not None and before is not None else None),
        "seconds": time.perf_counter() - t0,
    })
    report["ok"] = report["identical"]
    return report

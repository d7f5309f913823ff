"""What a grammar costs a decode step: 16 concurrent requests on the bundled SmolLM2, all
decoding, once free and once each constrained by a JSON schema; and what compiling costs,
cold and from the cache.

Reports, per mode, the median ms of an EngineCore.step() while all 16 decode, and (for the
constrained run) the ms of that spent filling the grammar bitmask; the overhead ratio
constrained / free; and the compile time of a new schema (cold) and of the same schema again
(a cache hit). Writes benchmarks/results/structured_output_overhead.json and .png.

    .venv/bin/python -m benchmarks.structured_output_overhead [--batch 16] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.machine import cpu_description

RESULTS = Path(__file__).parent / "results"

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 400},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 40},
    "year": {"type": "integer"}, "kind": {"enum": ["book", "film", "song"]}},
    "required": ["title", "tags", "year", "kind"]}


def step_times(engine, batch: int, steps: int, constrained: bool) -> tuple[list[float], float]:
    """ms of each step once all `batch` requests decode, and the ms spent filling bitmasks."""
    from officellm.engine import SamplingParams
    from officellm.engine.structured_output import StructuredOutputsParams
    from officellm.engine.structured_output import bitmask as bitmask_module

    spec = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=not constrained,
                            structured_outputs=spec)
    prompt = engine.input_processor.encode("Describe your favourite book as JSON:")
    for i in range(batch):
        engine.add_request(f"{constrained}-{i}", prompt, params)
    core = engine.engine_core
    while core.scheduler.waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in core.scheduler.running):
        engine.step()
    fill = [0.0]
    original = bitmask_module.grammar_bitmask

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        fill[0] += time.perf_counter() - t0
        return out

    import officellm.engine.engine_core as core_module
    core_module.grammar_bitmask = timed
    times = []
    try:
        for _ in range(steps):
            if len(core.scheduler.running) < batch:
                break  # a constrained request finished: the batch is no longer 16
            t0 = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        core_module.grammar_bitmask = original
    for i in range(batch):
        engine.abort_request(f"{constrained}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return times, fill[0] * 1e3 / max(1, len(times))


def compile_times(engine) -> dict:
    from officellm.engine.structured_output import StructuredOutputsParams

    compiler = engine.grammar_compiler
    fresh = dict(SCHEMA, properties={**SCHEMA["properties"], "rating": {"type": "number"}})
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputsParams(json=fresh))
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputsParams(json=fresh))
    cached = time.perf_counter() - t0
    return {"cold_ms": cold * 1e3, "cached_ms": cached * 1e3,
            "compiles": compiler.stats.compiles, "cache_hits": compiler.stats.cache_hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from officellm.engine import LLMEngine

    engine = LLMEngine(dtype="float32", kv_cache_memory="256MiB", num_threads=args.threads,
                       max_num_seqs=args.batch)
    # Warm both paths (kernels, the tokenizer info xgrammar builds on first use).
    step_times(engine, args.batch, 4, False)
    step_times(engine, args.batch, 4, True)
    free, _ = step_times(engine, args.batch, args.steps, False)
    constrained, fill_ms = step_times(engine, args.batch, args.steps, True)
    result = {
        "machine": cpu_description(), "model": engine.model_name, "batch": args.batch,
        "threads": args.threads,
        "free_step_ms_median": statistics.median(free),
        "constrained_step_ms_median": statistics.median(constrained),
        "bitmask_fill_ms_per_step": fill_ms,
        "overhead_ratio": statistics.median(constrained) / statistics.median(free),
        "steps_measured": [len(free), len(constrained)],
        "compile": compile_times(engine),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "structured_output_overhead.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(["free", "JSON schema"], [result["free_step_ms_median"],
                                     result["constrained_step_ms_median"]],
           color=["#888", "#3a7"])
    ax.set_ylabel("ms per decode step (median)")
    ax.set_title(f"{args.batch} concurrent requests, {engine.model_name}: "
                 f"x{result['overhead_ratio']:.3f}")
    fig.tight_layout()
    fig.savefig(RESULTS / "structured_output_overhead.png", dpi=120)


if __name__ == "__main__":
    main()

"""Engine step time with and without tensor parallelism, on the bundled SmolLM2 (CPU, gloo).

Runs a batch of identical-length decodes through LLMEngine.step() and reports the median
step time for each tensor_parallel_size, plus, under tensor parallelism, the time and size
of rank 0's per-step broadcast (the pickled StepBatch) measured on its own.

    .venv/bin/python benchmarks/tp_step_time.py [--tp 1 2] [--batch 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time


def measure(tp: int, batch: int, steps: int, threads: int, prompt_len: int) -> dict:
    from officellm.engine import LLM, SamplingParams
    from officellm.engine.worker.multiproc_executor import MultiprocExecutor

    with LLM(None, dtype="float32", kv_cache_memory="512MiB", tensor_parallel_size=tp,
             num_threads=threads) as llm:
        engine = llm.llm_engine
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"r{i}", [100 + (i + j) % 1000 for j in range(prompt_len)], params)
        t0 = time.perf_counter()
        engine.step()  # every prompt's prefill in one step
        prefill = time.perf_counter() - t0
        times = []
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        out = {"tp": tp, "prefill_step_ms": 1e3 * prefill,
               "decode_step_ms": 1e3 * statistics.median(times)}
        if isinstance(engine.engine_core.executor, MultiprocExecutor):
            # The broadcast alone: rank 0 pickles a decode StepBatch and sends it; the
            # workers receive it and run a step, which rank 0 then has to join.
            for i in range(batch):
                engine.add_request(f"b{i}", [100 + i, 101, 102], SamplingParams(max_tokens=3))
            engine.step()
            so = engine.engine_core.scheduler.schedule()
            step_batch, sampling = engine.engine_core.runner.batch_for(so)
            t0 = time.perf_counter()
            engine.engine_core.executor.send_step(step_batch)
            out["broadcast_ms"] = 1e3 * (time.perf_counter() - t0)
            out["broadcast_bytes"] = len(pickle.dumps(("step", step_batch)))
            engine.engine_core.runner.execute_batch(step_batch, sampling)
            for i in range(batch):
                engine.abort_request(f"b{i}")
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args()
    for tp in args.tp:
        r = measure(tp, args.batch, args.steps, args.threads, args.prompt_len)
        extra = (f", broadcast {r['broadcast_ms']:.2f} ms ({r['broadcast_bytes']:,} B)"
                 if "broadcast_ms" in r else "")
        print(f"tp={tp}: prefill step ({args.batch} x {args.prompt_len} tokens) "
              f"{r['prefill_step_ms']:.1f} ms, decode step (batch {args.batch}) "
              f"{r['decode_step_ms']:.1f} ms median{extra}", flush=True)


if __name__ == "__main__":
    main()

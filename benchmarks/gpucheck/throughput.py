"""(d) Offline throughput: the engine vs transformers' generate_batch, same model, same run.

Both get the same token-id prompts and produce exactly `output_len` tokens per request (no
EOS). The engine's time to first token (all requests arrive at once, so it includes the
queue behind the others' prefills) and inter-token latency are reported as p50/p99. Each side
runs under a deadline; the engine's rate is counted over the tokens it produced by then, and
a transformers run that misses its deadline yields an upper bound on its rate (all its tokens
/ the deadline), hence a lower bound on the engine's advantage.
"""

from __future__ import annotations

import threading
import time

import torch

from benchmarks.gpucheck.models import random_prompts
from officellm.engine.frontend.sampling_params import SamplingParams


def engine_throughput(engine, prompts: list[list[int]], output_len: int, deadline_s: float) -> dict:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    ids = [f"t{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    produced, finished = 0, 0
    last_token: dict[str, float] = {}  # request -> when its latest tokens came out
    ttft: list[float] = []
    itl: list[float] = []  # per token after the first: the gap since the previous output
    while engine.has_unfinished_requests() and time.perf_counter() - t0 < deadline_s:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            produced += n
            finished += out.finished
            if not n:
                continue
            before = last_token.get(out.request_id)
            if before is None:
                ttft.append(now - t0)
            else:
                itl.extend([(now - before) / n] * n)
            last_token[out.request_id] = now
    seconds = time.perf_counter() - t0
    complete = not engine.has_unfinished_requests()
    for rid in ids:
        engine.abort_request(rid)
    return {"seconds": seconds, "output_tokens": produced, "finished_requests": finished,
            "complete": complete, "tokens_per_s": produced / seconds,
            "preemptions": engine.stats().num_preemptions_total,
            "ttft_ms": percentiles_ms(ttft), "itl_ms": percentiles_ms(itl)}


def percentiles_ms(seconds: list[float]) -> dict:
    """p50 and p99 of `seconds`, in ms (None without samples)."""
    if not seconds:
        return {"p50": None, "p99": None}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3

    return {"p50": at(0.50), "p99": at(0.99)}


def hf_generate_batch(model, prompts: list[list[int]], output_len: int, deadline_s: float) -> dict:
    """transformers' continuous batching (generate_batch), timed including its warm-up."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=False, max_new_tokens=output_len, eos_token_id=-1,
                           pad_token_id=0)
    box: dict = {}

    def work() -> None:
        try:
            with torch.inference_mode():
                box["out"] = model.generate_batch(inputs=prompts, generation_config=cfg,
                                                  progress_bar=False)
        except Exception as exc:  # noqa: BLE001 - reported, not fatal to the check
            box["error"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(deadline_s)
    seconds = time.perf_counter() - t0
    total = len(prompts) * output_len
    if "error" in box:
        return {"error": box["error"], "seconds": seconds}
    if thread.is_alive():
        # Still running: it would need more than deadline_s for all its tokens.
        return {"complete": False, "seconds": seconds, "tokens_per_s_at_most": total / seconds}
    outs = list(box["out"].values())
    produced = sum(len(o.generated_tokens) for o in outs)
    errors = [str(o.error) for o in outs if getattr(o, "error", None)]
    result = {"complete": len(outs) == len(prompts) and produced == total, "seconds": seconds,
              "output_tokens": produced, "tokens_per_s": produced / seconds}
    if errors or not result["complete"]:
        result["error"] = (f"{len(outs)} of {len(prompts)} requests returned, {produced} of "
                           f"{total} tokens; first error: {errors[0] if errors else None}")
    return result


def compare(engine_result: dict, hf_result: dict) -> dict:
    """The engine's throughput over transformers', exact or as a lower bound."""
    ours = engine_result["tokens_per_s"]
    if "tokens_per_s" in hf_result:
        return {"ratio": ours / hf_result["tokens_per_s"], "bound": "exact"}
    if "tokens_per_s_at_most" in hf_result:
        return {"ratio": ours / hf_result["tokens_per_s_at_most"], "bound": "at least"}
    return {"ratio": None, "bound": "transformers failed"}


def workload(n: int, prompt_len: int, vocab: int) -> list[list[int]]:
    return random_prompts(n, prompt_len, vocab, seed=7)

"""Offline throughput on the bundled SmolLM2: officellm's engine vs transformers, one run.

64 chat requests with output lengths spread over 16-256 tokens (ignore_eos, so every system
produces exactly the same number of tokens), same dtype and threads for all three:
  engine           officellm's LLM.generate (continuous batching, paged KV)
  hf_generate      transformers generate() in static, left-padded batches of --hf-batch
  hf_generate_batch transformers' own continuous batching (generate_batch's manager, with a
                   per-request max_new_tokens)
Prints output tok/s and ratios; writes benchmarks/results/offline_cpu.json and a PNG.

    .venv/bin/python benchmarks/offline_throughput.py [--requests 64] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description, isa_caps  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"

TOPICS = ["the water cycle", "office coffee etiquette", "how a KV cache works", "spreadsheets",
          "the history of the printing press", "time management", "a haiku about Mondays",
          "the benefits of code review", "how to write a polite email", "photosynthesis",
          "the rules of chess", "planning a team offsite", "why the sky is blue", "recycling"]


def make_workload(n: int, seed: int, tokenizer) -> tuple[list[list[int]], list[int]]:
    from officellm.engine.llm import apply_chat_template

    rng = random.Random(seed)
    prompts, lengths = [], []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        words = rng.randint(1, 4)
        msg = f"Please tell me about {topic}." + " Be detailed." * words
        prompts.append(apply_chat_template(tokenizer, [{"role": "user", "content": msg}]))
        lengths.append(rng.randint(16, 256))
    return prompts, lengths


def run_engine(model_dir: Path, dtype: str, prompts, lengths, threads: int) -> dict:
    from officellm.engine import LLM, SamplingParams

    llm = LLM(str(model_dir), dtype=dtype, kv_cache_memory="2GiB", num_threads=threads)
    llm.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == sum(lengths), (produced, sum(lengths))
    core = llm.llm_engine.engine_core
    return {"seconds": dt, "output_tokens": produced, "dtype": str(core.dtype),
            "weights": core.weight_format}


def _hf_model(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()


@torch.inference_mode()
def run_hf_generate(model_dir: Path, dtype: torch.dtype, prompts, lengths, batch: int) -> dict:
    model = _hf_model(model_dir, dtype)
    pad = model.config.pad_token_id or 0
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch):
        ps, ls = prompts[start:start + batch], lengths[start:start + batch]
        width = max(len(p) for p in ps)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        # A static batch runs until its longest member is done; only requested tokens count.
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(ls),
                       min_new_tokens=max(ls), pad_token_id=pad)
    return {"seconds": time.perf_counter() - t0, "output_tokens": sum(lengths), "batch": batch}


@torch.inference_mode()
def run_hf_generate_batch(model_dir: Path, dtype: torch.dtype, prompts, lengths) -> dict:
    from transformers import GenerationConfig

    model = _hf_model(model_dir, dtype)
    cfg = GenerationConfig(do_sample=False, max_new_tokens=max(lengths), eos_token_id=-1,
                           pad_token_id=model.config.pad_token_id or 0)
    t0 = time.perf_counter()
    produced = 0
    with model.continuous_batching_context_manager(generation_config=cfg, block=True,
                                                   timeout=5) as manager:
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(prompts, lengths)]
        done = 0
        while done < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                produced += len(result.generated_tokens)
                done += 1
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped early")
    return {"seconds": time.perf_counter() - t0, "output_tokens": produced}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="auto picks what the engine picks")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip", nargs="*", default=[], help="hf_generate and/or hf_generate_batch")
    ap.add_argument("--out", default=str(RESULTS / "offline_cpu.json"))
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from officellm.engine.loading.model_loader import resolve_model_dir

    threads = args.threads
    torch.set_num_threads(threads)
    model_dir = resolve_model_dir(None)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts, lengths = make_workload(args.requests, args.seed, tok)

    results = {"engine": run_engine(model_dir, args.dtype, prompts, lengths, threads)}
    dtype = getattr(torch, results["engine"]["dtype"].removeprefix("torch."))
    if "hf_generate_batch" not in args.skip:
        results["hf_generate_batch"] = run_hf_generate_batch(model_dir, dtype, prompts, lengths)
    if "hf_generate" not in args.skip:
        results["hf_generate"] = run_hf_generate(model_dir, dtype, prompts, lengths, args.hf_batch)
    for r in results.values():
        r["output_tok_per_s"] = r["output_tokens"] / r["seconds"]
    eng = results["engine"]["output_tok_per_s"]
    print(f"{'system':<20}{'output tok/s':>14}{'engine is':>12}")
    for name, r in results.items():
        print(f"{name:<20}{r['output_tok_per_s']:>14.1f}{eng / r['output_tok_per_s']:>11.2f}x")
    report = {
        "benchmark": "offline_throughput", "model": "SmolLM2-135M-Instruct (bundled GGUF; transformers runs it dequantized)",
        "requests": args.requests, "output_tokens": sum(lengths), "threads": threads,
        "dtype": str(dtype), "cpu": cpu_description(),
        "cpu_isa_caps": isa_caps(),
        "torch": torch.__version__, "results": results,
        "ratios": {f"engine_vs_{k}": eng / v["output_tok_per_s"] for k, v in results.items() if k != "engine"},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _plot(report, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    vals = [report["results"][n]["output_tok_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, vals, color=["#2a7", "#888", "#aaa"][: len(names)])
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{report['requests']} requests, {report['output_tokens']} tokens, "
                 f"{report['threads']} threads, {report['dtype'].removeprefix('torch.')}")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""What `--batch-invariant` costs on the bundled model, on the CPU, in one run: offline
throughput, a long prompt's prefill, and an office of 16 chatting, each without and with the
mode (the same settings otherwise: the server's defaults, dtype and quantization `auto`).

  offline      LLM.generate of 64 chats, 16-256 output tokens each (offline_throughput.py's
               workload): output tok/s
  prefill      one ~2,600-token prompt, one output token: seconds to the first token
  office-16    16 people chatting on a fresh `officellm serve` (office profile,
               officellm bench --scenario office): output tok/s, TTFT and TPOT p50

Writes benchmarks/results/batch_invariance.json and .png, with the CPU.

    .venv/bin/python benchmarks/batch_invariance_cost.py [--threads 2] [--duration 40]
        [--quantization none --offline-only --out benchmarks/results/batch_invariance_dense.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from benchmarks.offline_throughput import make_workload  # noqa: E402
from officellm.loadgen import report  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
MODES = {"default": False, "batch-invariant": True}


def offline(invariant: bool, args: argparse.Namespace) -> dict[str, Any]:
    from officellm.engine import LLM, SamplingParams
    from officellm.engine.loading.model_loader import resolve_model_dir

    llm = LLM(str(resolve_model_dir(None)), kv_cache_memory="2GiB", num_threads=args.threads,
              batch_invariant=invariant, quantization=args.quantization)
    prompts, lengths = make_workload(64, args.seed, llm.get_tokenizer())
    llm.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    words = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(170))
    long_prompt = llm.apply_chat_template([{"role": "user", "content": words}])
    t0 = time.perf_counter()
    llm.generate([long_prompt], SamplingParams(max_tokens=1, temperature=0))
    prefill = time.perf_counter() - t0
    core = llm.llm_engine.engine_core
    return {"output_tok_per_s": produced / seconds, "seconds": seconds,
            "prefill_seconds": prefill, "prefill_tokens": len(long_prompt),
            "dtype": str(core.dtype), "weights": core.weight_format}


def office(invariant: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port), "--no-auth",
           "--db", str(tmp / f"{port}.db"), "--profile", "office", "--max-model-len", "4096",
           "--log-level", "warning", "--quantization", args.quantization]
    cmd += ["--batch-invariant"] if invariant else []
    server = Server(f"officellm-{port}", cmd, env, port, cwd=REPO)
    server.start(timeout=600)
    try:
        target = Target(server.base_url, api_key=None, max_context=4096,
                        extra_body={"ignore_eos": True})
        config = ScenarioConfig("office", 16, args.seed, 128, 1.0)
        return report.build(asyncio.run(run_bench(target, config, None, args.duration)))
    finally:
        server.stop()
        server.remove_log()


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("offline output tok/s", lambda r: r["offline"]["output_tok_per_s"]),
              ("2.6k-token prefill, s", lambda r: r["offline"]["prefill_seconds"])]
    if all("office-16" in r for r in results.values()):
        panels.append(("office-16 output tok/s",
                       lambda r: r["office-16"]["summary"]["output_tok_per_s"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 4))
    for ax, (title, value) in zip(axes, panels):
        ax.bar(list(results), [value(r) for r in results.values()], color=["C0", "C1"])
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duration", type=float, default=40.0, help="seconds of office load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantization", default="auto",
                   help="auto keeps the bundled GGUF's blocks; none runs dense bf16 matmuls, "
                        "where the mode swaps oneDNN for the fixed-order kernel")
    p.add_argument("--offline-only", action="store_true", help="skip office-16")
    p.add_argument("--out", type=Path, default=RESULTS / "batch_invariance.json")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, invariant in MODES.items():
            r = results[name] = {"offline": offline(invariant, args)}
            print(f"[{name}] offline {r['offline']['output_tok_per_s']:.1f} tok/s, "
                  f"prefill {r['offline']['prefill_tokens']} tokens "
                  f"{r['offline']['prefill_seconds']:.2f} s", flush=True)
            if not args.offline_only:
                r["office-16"] = office(invariant, args, Path(tmp))
                print(f"[{name}] office-16 {report.text_summary(r['office-16'])}", flush=True)
    base, inv = results["default"], results["batch-invariant"]
    ratios = {
        "offline_tok_per_s": inv["offline"]["output_tok_per_s"] / base["offline"]["output_tok_per_s"],
        "prefill_seconds": inv["offline"]["prefill_seconds"] / base["offline"]["prefill_seconds"],
    }
    if not args.offline_only:
        ratios["office16_tok_per_s"] = (inv["office-16"]["summary"]["output_tok_per_s"]
                                        / base["office-16"]["summary"]["output_tok_per_s"])
    print("batch-invariant / default: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    out = {"machine": cpu_description(), "settings": vars(args) | {"out": str(args.out)},
           "ratios": ratios, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

"""The engine loop's host overhead: ms per decode step outside the model's forward.

A tiny random Llama (2 layers, hidden 64, a 1,024-token vocabulary over SmolLM2's tokenizer)
makes the model's own compute negligible, so what is left is the per-request Python of a
step. For batches of 16, 64 and 256 decoding requests, on one thread, it reports:
  core_ms          EngineCore.step(): schedule -> execute -> update (the engine loop)
  forward_ms       of which the model's forward (attention kernels included)
  core_outside_ms  core_ms - forward_ms: the engine loop's own overhead
  output_ms        OutputProcessor.process_outputs (detokenization, deltas), which the server
                   runs on its event loop's thread, not on the engine loop
Writes benchmarks/results/step_overhead.json and .png.

    .venv/bin/python -m benchmarks.step_overhead [--batches 16 64 256] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import cpu_description

RESULTS = Path(__file__).parent / "results"


def build_model(out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from officellm.engine.loading.model_loader import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(None)))
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def measure(engine, batch: int, steps: int, prompt_len: int) -> dict:
    from officellm.engine import SamplingParams

    core, outputs = engine.engine_core, engine.output_processor
    model = core.model
    forward_s = [0.0]
    original = model.forward

    def timed_forward(*args, **kwargs):
        t0 = time.perf_counter()
        result = original(*args, **kwargs)
        forward_s[0] += time.perf_counter() - t0
        return result

    model.forward = timed_forward
    rng = random.Random(batch)
    params = SamplingParams(temperature=0, max_tokens=steps + 64, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, [rng.randrange(3, 1000) for _ in range(prompt_len)], params)
    while core.scheduler.waiting or any(r.num_output_tokens == 0 for r in core.scheduler.running):
        engine.step()  # prefills, until every request decodes
    for _ in range(5):
        engine.step()
    core_s = output_s = 0.0
    forward_s[0] = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        step_outputs = core.step()
        t1 = time.perf_counter()
        processed = outputs.process_outputs(step_outputs)
        core.abort_requests(processed.reqs_to_abort)
        output_s += time.perf_counter() - t1
        core_s += t1 - t0
        assert len(step_outputs) == batch
    for rid in ids:
        engine.abort_request(rid)
    model.forward = original
    ms = 1e3 / steps
    return {"batch": batch, "core_ms": core_s * ms, "forward_ms": forward_s[0] * ms,
            "core_outside_ms": (core_s - forward_s[0]) * ms, "output_ms": output_s * ms,
            "core_outside_share": (core_s - forward_s[0]) / core_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS / "step_overhead.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    from officellm.engine import LLMEngine

    with tempfile.TemporaryDirectory() as tmp:
        engine = LLMEngine(model=str(build_model(Path(tmp))), dtype="float32",
                           kv_cache_memory="512MiB", num_threads=1,
                           max_num_seqs=max(args.batches), stats_log_interval=0)
        rows = [measure(engine, b, args.steps, args.prompt_len) for b in args.batches]
    print(f"{'batch':>6}{'core ms':>10}{'forward':>10}{'outside':>10}{'output ms':>11}")
    for r in rows:
        print(f"{r['batch']:>6}{r['core_ms']:>10.2f}{r['forward_ms']:>10.2f}"
              f"{r['core_outside_ms']:>10.2f}{r['output_ms']:>11.2f}")
    report = {"benchmark": "step_overhead", "threads": 1, "steps": args.steps,
              "model": "random Llama, 2 layers, hidden 64, vocab 1024", "cpu": cpu_description(),
              "torch": torch.__version__, "results": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["batch"]) for r in rows]
    forward = [r["forward_ms"] for r in rows]
    outside = [r["core_outside_ms"] for r in rows]
    output = [r["output_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(labels, forward, label="model forward", color="#888")
    ax.bar(labels, outside, bottom=forward, label="engine loop, outside the forward", color="#2a7")
    ax.bar(labels, output, bottom=[f + o for f, o in zip(forward, outside)],
           label="output processing (off the engine loop)", color="#9cd")
    ax.set_xlabel("decoding requests")
    ax.set_ylabel("ms per step (1 thread)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

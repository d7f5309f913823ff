"""The engine in the server's process against an engine process per model, on the bundled
model, on the CPU, in one run (issue 56).

For each mode (`--engine-in-process`, then the default: a process per engine), on a fresh
`officellm serve` (office profile):

  office-16  16 users chatting for --duration seconds: output tok/s, TTFT and ITL p50/p99
  office-1   one user: ITL p50/p99 (what one person typing sees)
  load-stall a second model (the bundled GGUF again, under another name: a real load, its
             weights converted and packed) loads on its first request while the default
             model streams: that stream's longest gap between tokens during the load

Targets: office-1 ITL no worse in a process; office-16 ITL p99 better; the load's stall on
the other model's stream under 100 ms on 2 cores (0.78 s in-process, measured by the model
pool's test before this change). Writes benchmarks/results/engine_process.json (both modes,
the machine) and .png.

    .venv/bin/python benchmarks/engine_process.py [--threads 2] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from officellm.loadgen import report  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
KEY = "bench"
HEADERS = {"Authorization": f"Bearer {KEY}"}
MODES = {"in-process": ["--engine-in-process"], "engine-process": []}


def start_server(args: argparse.Namespace, mode: str, tmp: Path) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port),
           "--db", str(tmp / f"{mode}.db"), "--profile", "office", "--api-key", KEY,
           "--kv-cache-memory", args.kv_cache_memory, "--max-model-len",
           str(args.max_model_len), "--log-level", "warning", *MODES[mode]]
    server = Server(f"officellm-{mode}", cmd, env, port, cwd=REPO)
    server.start(timeout=600)
    return server


def office(server: Server, args: argparse.Namespace, users: int) -> dict[str, Any]:
    config = ScenarioConfig("office", users, args.seed, args.max_tokens, args.think_time)
    target = Target(server.base_url, api_key=KEY, max_context=args.max_model_len)
    doc = report.build(asyncio.run(run_bench(target, config, None, args.duration)))
    print(f"  office-{users}: {report.text_summary(doc)}", flush=True)
    return doc


def load_stall(server: Server, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Register the bundled model again as `second`, stream from the default, and send
    `second` its first request meanwhile: the stream's longest gap while it loads."""
    admin = {"Authorization": "Bearer " + (tmp / "admin_token").read_text().strip()}
    r = httpx.post(f"{server.base_url}/admin/models", headers=admin, timeout=60,
                   json={"name": "second", "source": "bundled",
                         "options": {"kv_cache_memory": args.kv_cache_memory}})
    r.raise_for_status()
    arrivals: list[float] = []
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "stream": True,
            "max_tokens": args.stall_tokens, "min_tokens": args.stall_tokens,
            "temperature": 0}

    def read() -> None:
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                          headers=HEADERS, timeout=600) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    arrivals.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    while len(arrivals) < 10:
        time.sleep(0.01)
    t0 = time.monotonic()
    answer = httpx.post(f"{server.base_url}/v1/chat/completions", headers=HEADERS, timeout=600,
                        json={"model": "second", "max_tokens": 1,
                              "messages": [{"role": "user", "content": "Hi"}]})
    t1 = time.monotonic()
    reader.join()
    answer.raise_for_status()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if t0 <= b <= t1 + 0.5]
    before = [b - a for a, b in zip(arrivals[:10], arrivals[1:10])]
    result = {"load_and_first_answer_s": t1 - t0, "tokens_during_load": len(gaps),
              "longest_gap_s": max(gaps, default=None),
              "median_gap_before_s": sorted(before)[len(before) // 2] if before else None}
    print(f"  load-stall: {json.dumps(result)}", flush=True)
    return result


def q(doc: dict[str, Any], kind: str, quantile: str) -> float | None:
    return doc["summary"][kind][quantile]


def table(runs: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'mode':<16}{'o16 tok/s':>10}{'o16 TTFT p50/p99 ms':>22}{'o16 ITL p50/p99 ms':>21}"
             f"{'o1 ITL p50/p99 ms':>20}{'stall ms':>10}"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    for mode, run in runs.items():
        o16, o1 = run["office-16"], run["office-1"]
        lines.append(
            f"{mode:<16}{o16['summary']['output_tok_per_s']:>10.1f}"
            f"{ms(q(o16, 'ttft_s', 'p50')) + ' / ' + ms(q(o16, 'ttft_s', 'p99')):>22}"
            f"{ms(q(o16, 'itl_s', 'p50')) + ' / ' + ms(q(o16, 'itl_s', 'p99')):>21}"
            f"{ms(q(o1, 'itl_s', 'p50')) + ' / ' + ms(q(o1, 'itl_s', 'p99')):>20}"
            f"{ms(run['load-stall']['longest_gap_s']):>10}")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(runs)
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    axes[0].bar(modes, [runs[m]["office-16"]["summary"]["output_tok_per_s"] for m in modes])
    axes[0].set_title("office-16 output tok/s")
    for ax, (scenario, kind) in zip(axes[1:3], (("office-16", "itl_s"), ("office-1", "itl_s"))):
        xs = range(len(modes))
        for off, quantile in ((-0.2, "p50"), (0.2, "p99")):
            ax.bar([x + off for x in xs],
                   [(q(runs[m][scenario], kind, quantile) or 0) * 1000 for m in modes],
                   width=0.4, label=quantile)
        ax.set_xticks(list(xs), modes)
        ax.set_title(f"{scenario} ITL (ms)")
        ax.legend()
    axes[3].bar(modes, [(runs[m]["load-stall"]["longest_gap_s"] or 0) * 1000 for m in modes],
                color="#b55")
    axes[3].axhline(100, color="k", lw=0.8, ls="--")
    axes[3].set_title("longest gap in a stream while\nanother model loads (ms)")
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--think-time", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-memory", default="512MiB")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--stall-tokens", type=int, default=200)
    p.add_argument("--out", default="engine_process")
    args = p.parse_args()
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        print(f"[{mode}]", flush=True)
        with tempfile.TemporaryDirectory(prefix="officellm-bench-") as tmp_dir:
            tmp = Path(tmp_dir)
            os.environ["OFFICELLM_DATA_DIR"] = str(tmp)
            server = start_server(args, mode, tmp)
            try:
                runs[mode] = {"office-16": office(server, args, 16),
                              "office-1": office(server, args, 1),
                              "load-stall": load_stall(server, args, tmp)}
            finally:
                server.stop()
                server.remove_log()
    print(table(runs))
    ins, own = runs["in-process"], runs["engine-process"]
    ratios = {
        "office1_itl_p50_process_over_inprocess": (q(own["office-1"], "itl_s", "p50") or 0)
        / (q(ins["office-1"], "itl_s", "p50") or 1),
        "office16_itl_p99_process_over_inprocess": (q(own["office-16"], "itl_s", "p99") or 0)
        / (q(ins["office-16"], "itl_s", "p99") or 1),
        "office16_tok_s_process_over_inprocess":
            own["office-16"]["summary"]["output_tok_per_s"]
            / (ins["office-16"]["summary"]["output_tok_per_s"] or 1),
    }
    print(json.dumps(ratios, indent=1))
    doc = {"machine": cpu_description(), "threads": args.threads, "settings": vars(args),
           "ratios": ratios,
           "runs": {m: {"office-16": {k: v for k, v in r["office-16"].items()
                                      if k not in ("requests", "timeline")},
                        "office-1": {k: v for k, v in r["office-1"].items()
                                     if k not in ("requests", "timeline")},
                        "load-stall": r["load-stall"]} for m, r in runs.items()}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(doc, indent=1))
    plot(runs, RESULTS / f"{args.out}.png")
    print(f"wrote {RESULTS / args.out}.json and .png")


if __name__ == "__main__":
    main()

"""Soak: the office scenario (officellm bench) for N minutes against a server this script
starts; reports errors, RSS growth and KV leaks, and exits 1 if it found any.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--users 8] [--model PATH]
        [--threads 1] [--kv-cache-memory 512MiB] [--out benchmarks/results/soak.json]
        [--server-flag=--max-num-seqs=16]

While the load runs it samples the server's resident memory (/proc) and its engine gauges
(/metrics) every --sample-every seconds. Afterwards it waits for the server to go idle and
checks that no KV block is still held (vllm:kv_cache_usage_perc counts blocks held by live
requests only, so an idle server must read 0) and that the log has no ERROR line. RSS growth
is measured from the end of the warm-up (allocator pools, caches and the prefix cache fill
during the first minute), so what is left is what a week of uptime would accumulate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.bench import report  # noqa: E402
from app.bench.local_server import Server, free_port  # noqa: E402
from app.bench.runner import Target, run_bench  # noqa: E402
from app.bench.scenarios import ScenarioConfig  # noqa: E402

API_KEY = "soak-key"
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss_mib: float
    running: float
    waiting: float
    kv_usage: float


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def gauges(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics", timeout=10)).text
    wanted = {v: k for k, v in GAUGES.items()}
    out = dict.fromkeys(GAUGES, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                out[wanted[s.name]] += s.value
    return out


async def sample_until(http: httpx.AsyncClient, pid: int, t0: float, every: float,
                       samples: list[Sample], stop: asyncio.Event) -> None:
    while not stop.is_set():
        g = await gauges(http)
        samples.append(Sample(round(time.monotonic() - t0, 1), round(rss_mib(pid), 1), **g))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


async def wait_idle(http: httpx.AsyncClient, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        g = await gauges(http)
        if (g["running"] == 0 and g["waiting"] == 0) or time.monotonic() > deadline:
            return g
        await asyncio.sleep(0.5)


async def soak(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    assert server.proc is not None
    pid = server.proc.pid
    target = Target(server.base_url, API_KEY)
    config = ScenarioConfig("office", args.users, args.seed, args.max_tokens, args.think_time)
    samples: list[Sample] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample_until(http, pid, t0, args.sample_every, samples,
                                                   stop))
        result = await run_bench(target, config, None, args.minutes * 60)
        idle = await wait_idle(http, 120)
        stop.set()
        await sampler
    doc = report.build(result)
    records = result.records
    errors = [r.error for r in records if r.error]
    warm = [s for s in samples if s.t >= args.warmup] or samples
    log_errors = [line for line in server.output().splitlines()
                  if " ERROR " in line or " CRITICAL " in line]
    summary = {
        "minutes": args.minutes, "users": args.users,
        "requests": {"sent": len(records), "completed": sum(r.ok for r in records),
                     "errors": len(errors), "first_errors": sorted(set(errors))[:5]},
        "output_tok_per_s": doc["summary"]["output_tok_per_s"],
        "e2e_p99_s": doc["summary"]["e2e_s"]["p99"],
        "preemptions": doc["server_metrics"]["preemptions"],
        "rss_mib": {"start": samples[0].rss_mib, "after_warmup": warm[0].rss_mib,
                    "peak": max(s.rss_mib for s in samples), "end": samples[-1].rss_mib,
                    "growth_after_warmup": round(samples[-1].rss_mib - warm[0].rss_mib, 1)},
        "kv": {"peak_usage": max(s.kv_usage for s in samples), "idle_usage": idle["kv_usage"],
               "idle_running": idle["running"], "idle_waiting": idle["waiting"]},
        "log_errors": log_errors[:10],
    }
    leaks = idle["kv_usage"] > 0 or idle["running"] > 0 or idle["waiting"] > 0
    summary["ok"] = (not errors and not leaks and not log_errors
                     and summary["rss_mib"]["growth_after_warmup"] <= args.max_rss_growth_mib)
    return {"summary": summary, "samples": [asdict(s) for s in samples], "bench": doc}


def make_server(args: argparse.Namespace, tmp: Path) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    model = [args.model] if args.model else []
    # A pool of known size: the KV pool's pages are touched lazily, so a large default pool
    # would read as RSS "growth" for as long as the office has not used all of it yet.
    pool = [] if any(f.startswith("--kv-cache-memory") for f in args.server_flag) else [
        "--kv-cache-memory", args.kv_cache_memory]
    return Server("officellm", [sys.executable, "-m", "app.cli", "serve", *model,
                                "--port", str(port), "--db", str(tmp / "soak.db"),
                                "--api-key", API_KEY, *pool, *args.server_flag], env, port, cwd=REPO)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--think-time", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds before RSS growth is counted")
    p.add_argument("--max-rss-growth-mib", type=float, default=64.0)
    p.add_argument("--kv-cache-memory", default="512MiB", help="the server's KV pool")
    p.add_argument("--server-flag", action="append", default=[],
                   help="extra flag for officellm serve (repeat; use --server-flag=--x=1)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "soak.json")
    args = p.parse_args()
    server = make_server(args, Path(tempfile.mkdtemp(prefix="soak-")))
    print(f"starting officellm on {server.base_url} ...", flush=True)
    server.start()
    try:
        result = asyncio.run(soak(args, server))
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.out}; server log {server.log.name}")
    return 0 if result["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

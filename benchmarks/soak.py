"""Soak: the office scenario (officellm bench) for N minutes against a server this script
starts; reports errors, RSS growth and KV leaks, and exits 1 if it found any.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--users 8] [--model PATH]
        [--threads 1] [--kv-cache-memory 512MiB] [--out benchmarks/results/soak.json]
        [--server-flag=--max-num-seqs=16]

The run is split into rounds of --round-minutes (new conversations each round, same shape).
After every round it waits for the server to go idle and reads, at rest: resident memory
(/proc), and the engine's gauges (/metrics): no request may be left running or waiting, and
no KV block held (vllm:kv_cache_usage_perc counts blocks held by live requests only, so an idle
server must read 0). RSS under load follows the conversations' lengths (bigger batches, longer
attention), so a leak is judged at rest: the idle RSS may grow in the first round (allocator
pools, the largest shapes) but not round after round. The log must have no ERROR line. While
the load runs, RSS and the gauges are also sampled every --sample-every seconds.
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

from officellm.loadgen import report  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402

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


@dataclass
class RoundEnd:
    """The server at rest after one round: what a leak would show."""

    round: int
    t: float
    requests: int
    errors: int
    idle_rss_mib: float
    kv_usage: float
    running: float
    waiting: float


async def soak(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    """Rounds of the office scenario (a new seed each: new conversations, same shape); after
    each, wait for the server to go idle and read its RSS and KV usage at rest."""
    assert server.proc is not None
    pid = server.proc.pid
    target = Target(server.base_url, API_KEY)
    rounds = max(1, round(args.minutes / args.round_minutes))
    samples: list[Sample] = []
    ends: list[RoundEnd] = []
    docs = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample_until(http, pid, t0, args.sample_every, samples,
                                                   stop))
        for i in range(rounds):
            config = ScenarioConfig("office", args.users, args.seed + i, args.max_tokens,
                                    args.think_time)
            result = await run_bench(target, config, None, args.minutes * 60 / rounds)
            idle = await wait_idle(http, 120)
            await asyncio.sleep(1.0)  # let the allocator settle after the last request
            docs.append(report.build(result))
            ends.append(RoundEnd(i, round(time.monotonic() - t0, 1), len(result.records),
                                 sum(1 for r in result.records if r.error),
                                 round(rss_mib(pid), 1), **idle))
            print(f"round {i}: {ends[-1]}", flush=True)
        stop.set()
        await sampler
    errors = [r.error for d in docs for r in d["requests"] if r.get("error")]
    log_errors = [line for line in server.output().splitlines()
                  if " ERROR " in line or " CRITICAL " in line]
    # Round 0 warms up (allocator pools, the prefix cache, the largest batch shapes); growth
    # from its end to the last round's end is what more weeks of the same would accumulate.
    growth = ends[-1].idle_rss_mib - ends[0].idle_rss_mib
    per_round = growth / (len(ends) - 1) if len(ends) > 1 else 0.0
    summary = {
        "minutes": args.minutes, "users": args.users, "rounds": rounds,
        "requests": {"sent": sum(e.requests for e in ends),
                     "completed": sum(d["summary"]["requests"]["completed"] for d in docs),
                     "errors": len(errors), "first_errors": sorted(set(errors))[:5]},
        "output_tok_per_s": round(sum(d["summary"]["output_tok_per_s"] for d in docs)
                                  / len(docs), 1),
        "e2e_p99_s": max(d["summary"]["e2e_s"]["p99"] or 0.0 for d in docs),
        "preemptions": sum(d["server_metrics"]["preemptions"] or 0 for d in docs),
        "rss_mib": {"start": samples[0].rss_mib, "peak": max(s.rss_mib for s in samples),
                    "idle_after_each_round": [e.idle_rss_mib for e in ends],
                    "growth_after_warmup_round": round(growth, 1),
                    "growth_per_round": round(per_round, 1)},
        "kv": {"peak_usage": max(s.kv_usage for s in samples),
               "idle_usage_after_each_round": [e.kv_usage for e in ends],
               "left_running_or_waiting": sum(e.running + e.waiting for e in ends)},
        "log_errors": log_errors[:10],
    }
    leaks = any(e.kv_usage > 0 or e.running > 0 or e.waiting > 0 for e in ends)
    summary["ok"] = (not errors and not leaks and not log_errors
                     and per_round <= args.max_rss_growth_mib)
    for doc in docs:  # the per-request detail (chunk times) would make the file huge
        doc.pop("requests")
    return {"summary": summary, "round_ends": [asdict(e) for e in ends],
            "samples": [asdict(s) for s in samples], "rounds": docs}


def make_server(args: argparse.Namespace, tmp: Path) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    model = [args.model] if args.model else []
    # A pool of known size: the KV pool's pages are touched lazily, so a large default pool
    # would read as RSS "growth" for as long as the office has not used all of it yet.
    pool = [] if any(f.startswith("--kv-cache-memory") for f in args.server_flag) else [
        "--kv-cache-memory", args.kv_cache_memory]
    return Server("officellm", [sys.executable, "-m", "officellm.cli", "serve", *model,
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
    p.add_argument("--round-minutes", type=float, default=0.5,
                   help="length of one round; the server is checked at rest after each")
    p.add_argument("--max-rss-growth-mib", type=float, default=16.0,
                   help="most idle-RSS growth per round after the first that still passes")
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

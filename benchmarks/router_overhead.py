"""office-16 through HAProxy to two replicas, against one replica on its own, on one machine
(docs/cluster.md): what scaling out costs and gives here, and what the router adds to each
request.

Two runs, each on fresh replicas sharing a fresh PostgreSQL database (started here, like the
tests', in a temporary directory), the bundled model, every simulated person their own
static key (so the router pins each to a replica):

  one-replica   one `officellm serve` with --threads cores, the load sent to it directly
  two-routed    two replicas with --threads cores/2 each (the same cores, split), behind the
                HAProxy configuration `officellm cluster haproxy-config` writes

During two-routed a probe asks `GET /v1/models` every 0.2 s both through the router and
directly from the replica the router pins the probe's key to, back to back in alternating
order, each over its own kept-alive connection: the pair's difference is what the router
adds to a request (parsing, the person's stick-table lookup, the second hop), measured
under the office's load rather than on an idle machine. On 2 cores expect no gain from the
second replica (the cores are what limits); on a second box it is the point.

Writes benchmarks/results/router_overhead.json (both runs' bench documents, the probe's
samples and percentiles, the machine) and .png.

    .venv/bin/python benchmarks/router_overhead.py [--users 16] [--duration 60]
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
from officellm.installer.haproxy_config import ReplicaAddress, haproxy_config  # noqa: E402
from officellm.loadgen import report  # noqa: E402
from officellm.loadgen.local_haproxy import HAProxy  # noqa: E402
from officellm.loadgen.local_haproxy import missing as haproxy_missing  # noqa: E402
from officellm.loadgen.local_postgres import PostgresServer  # noqa: E402
from officellm.loadgen.local_postgres import missing as postgres_missing  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402
from officellm.loadgen.summary import describe  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
PROBE_KEY = "probe"
PROBE_INTERVAL_S = 0.2


def start_replica(args: argparse.Namespace, name: str, threads: int, database_url: str,
                  keys: list[str], tmp: Path) -> Server:
    data = tmp / name
    data.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO), OFFICELLM_DATA_DIR=str(data))
    port = free_port()
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port),
           "--database-url", database_url, "--replica-name", name, "--profile", "office",
           "--num-threads", str(threads), "--max-model-len", str(args.max_model_len),
           "--log-level", "warning"]
    for key in keys:
        cmd += ["--api-key", key]
    server = Server(name, cmd, env, port, cwd=REPO)
    server.start(timeout=600)
    return server


class Probe(threading.Thread):
    """`GET /v1/models` through the router and straight from the replica it pins the probe's
    key to, back to back, every PROBE_INTERVAL_S until stopped: (router s, direct s) pairs."""

    def __init__(self, router_url: str, replicas: dict[str, str]):
        super().__init__(daemon=True)
        headers = {"Authorization": f"Bearer {PROBE_KEY}"}
        self.router = httpx.Client(base_url=router_url, headers=headers, timeout=60)
        home = self.router.get("/v1/models")
        home.raise_for_status()
        self.replica = home.headers["x-officellm-replica"]
        self.direct = httpx.Client(base_url=replicas[self.replica], headers=headers,
                                   timeout=60)
        self.pairs: list[tuple[float, float]] = []
        self.wrong_replica = 0  # answers through the router from another replica
        self.done = threading.Event()

    def _time(self, client: httpx.Client) -> tuple[float, httpx.Response]:
        began = time.perf_counter()
        r = client.get("/v1/models")
        return time.perf_counter() - began, r

    def run(self) -> None:
        flip = False
        while not self.done.wait(PROBE_INTERVAL_S):
            order = (self.direct, self.router) if flip else (self.router, self.direct)
            timed = {id(c): self._time(c) for c in order}
            (routed_s, routed), (direct_s, direct) = timed[id(self.router)], timed[id(self.direct)]
            flip = not flip
            if routed.status_code != 200 or direct.status_code != 200:
                continue
            if routed.headers.get("x-officellm-replica") != self.replica:
                self.wrong_replica += 1
                continue
            self.pairs.append((routed_s, direct_s))

    def stop(self) -> dict[str, Any]:
        self.done.set()
        self.join()
        self.router.close()
        self.direct.close()
        return {"replica": self.replica, "interval_s": PROBE_INTERVAL_S,
                "answered_by_another_replica": self.wrong_replica,
                "router_s": describe([a for a, _ in self.pairs]),
                "direct_s": describe([b for _, b in self.pairs]),
                "added_s": describe([a - b for a, b in self.pairs]),
                "pairs": self.pairs}


def run_load(args: argparse.Namespace, base_url: str, keys: list[str]) -> dict[str, Any]:
    config = ScenarioConfig("office", args.users, args.seed, args.max_tokens, args.think_time)
    target = Target(base_url, api_key=keys[0], max_context=args.max_model_len,
                    light_api_keys=keys)
    result = asyncio.run(run_bench(target, config, None, args.duration))
    return report.build(result)


def one_replica(args: argparse.Namespace, pg: PostgresServer, keys: list[str],
                tmp: Path) -> dict[str, Any]:
    replica = start_replica(args, "solo", args.threads, pg.url(), keys, tmp)
    try:
        doc = run_load(args, replica.base_url, keys)
    finally:
        replica.stop()
        replica.remove_log()
    print(f"[one-replica] {report.text_summary(doc)}", flush=True)
    return doc


def two_routed(args: argparse.Namespace, pg: PostgresServer, keys: list[str],
               tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    url = pg.url()
    threads = max(1, args.threads // 2)
    replicas: list[Server] = []
    router = None
    try:
        for i in range(2):
            replicas.append(start_replica(args, f"r{i}", threads, url, [*keys, PROBE_KEY], tmp))
        port = free_port()
        config = tmp / "haproxy.cfg"
        config.write_text(haproxy_config(
            [ReplicaAddress.parse(f"{r.name}={r.base_url}") for r in replicas],
            bind=f"127.0.0.1:{port}"))
        router = HAProxy(config, port)
        people = pin_people(router.base_url, keys)
        probe = Probe(router.base_url, {r.name: r.base_url for r in replicas})
        probe.start()
        try:
            doc = run_load(args, router.base_url, keys)
        finally:
            probed = probe.stop()
        doc["people_per_replica"] = people
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.stop()
            r.remove_log()
    print(f"[two-routed] {report.text_summary(doc)}", flush=True)
    return doc, probed


def pin_people(router_url: str, keys: list[str]) -> dict[str, int]:
    """Each person's first request through the router (`GET /v1/models`) places them on a
    replica, where they then stay: how many people each replica got."""
    people: dict[str, int] = {}
    for key in keys:
        r = httpx.get(f"{router_url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                      timeout=60)
        r.raise_for_status()
        name = r.headers["x-officellm-replica"]
        people[name] = people.get(name, 0) + 1
    return people


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def table(docs: dict[str, dict[str, Any]], probe: dict[str, Any]) -> str:
    lines = [f"{'run':<14}{'req/s':>7}{'out tok/s':>11}{'TTFT p50/p99 ms':>20}"
             f"{'ITL p50/p99 ms':>18}{'E2E p50/p99 s':>17}{'errors':>8}"]
    for label, doc in docs.items():
        s = doc["summary"]
        e2e = s["e2e_s"]
        lines.append(
            f"{label:<14}{s['req_per_s']:>7.2f}{s['output_tok_per_s']:>11.1f}"
            f"{ms(s['ttft_s']['p50']) + ' / ' + ms(s['ttft_s']['p99']):>20}"
            f"{ms(s['itl_s']['p50']) + ' / ' + ms(s['itl_s']['p99']):>18}"
            f"{(e2e['p50'] or 0):>8.2f} / {(e2e['p99'] or 0):.2f}"
            f"{s['requests']['errors']:>8}")
    a = probe["added_s"]
    lines.append(f"router adds per request (GET /v1/models, {a['count']} pairs under load): "
                 f"p50 {ms(a['p50'])} ms, p99 {ms(a['p99'])} ms "
                 f"(through it p50 {ms(probe['router_s']['p50'])} ms, "
                 f"direct p50 {ms(probe['direct_s']['p50'])} ms)")
    return "\n".join(lines)


def plot(docs: dict[str, dict[str, Any]], probe: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    labels = list(docs)
    for ax, kind, title in ((axes[0], "ttft_s", "office TTFT"), (axes[1], "e2e_s", "office E2E")):
        xs = range(len(labels))
        for off, q in ((-0.2, "p50"), (0.2, "p99")):
            ax.bar([x + off for x in xs],
                   [(docs[k]["summary"][kind][q] or 0) * 1000 for k in labels], width=0.4,
                   label=q)
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend()
    added = sorted((a - b) * 1000 for a, b in probe["pairs"])
    if added:
        axes[2].plot(added, [i / len(added) for i in range(len(added))])
    axes[2].set_xlabel("ms the router added (through it minus direct)")
    axes[2].set_ylabel("fraction of probes")
    axes[2].set_title("router's added latency per request (CDF)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                   help="cores for the one replica; each of the two gets half")
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of load per run (in-flight requests then finish)")
    p.add_argument("--max-tokens", type=int, default=64, help="cap on a reply")
    p.add_argument("--think-time", type=float, default=4.0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "router_overhead.json")
    args = p.parse_args()
    for reason in (postgres_missing(), haproxy_missing()):
        if reason is not None:
            sys.exit(f"router_overhead: {reason}")
    keys = [f"person-{i}" for i in range(args.users)]
    tmp = Path(tempfile.mkdtemp(prefix="router-overhead-"))
    t0 = time.monotonic()
    pg = PostgresServer()
    try:
        docs = {"one-replica": one_replica(args, pg, keys, tmp)}
        docs["two-routed"], probe = two_routed(args, pg, keys, tmp)
    finally:
        pg.stop()
    print(table(docs, probe))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": cpu_description(), "settings": vars(args) | {"out": str(args.out)},
        "wall_s": time.monotonic() - t0, "table": table(docs, probe), "probe": probe,
        "runs": docs}, indent=1))
    plot(docs, probe, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()

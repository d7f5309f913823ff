"""How long the bundled model takes to be ready: a cold start (the page cache dropped, as
after a reboot), a warm start (its files cached), and a wake from idle sleep
(`--sleep-idle-seconds`), in one run on one machine.

  cold start   `officellm serve` launched to /health 200, after `sync; echo 3 >
               /proc/sys/vm/drop_caches` (root only; skipped otherwise, saying so)
  warm start   the same, its files in the page cache
  wake         a sleeping server's first request (a one-token chat) minus the same request
               awake; and the server's own officellm:model_wake_seconds

Writes benchmarks/results/model_load_time.json and .png.

    .venv/bin/python benchmarks/model_load_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
KEY = "bench"
ASK = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def drop_page_cache() -> bool:
    """Empty the page cache (root only); False where it cannot be."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def server(tmp: Path, *flags: str) -> Server:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OFFICELLM_DATA_DIR=str(tmp / str(port)))
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port),
           "--db", str(tmp / f"{port}.db"), "--api-key", KEY, "--log-level", "warning", *flags]
    return Server("officellm-load", cmd, env, port, cwd=REPO)


def start_seconds(tmp: Path) -> float:
    """Launch to /health 200."""
    s = server(tmp)
    t0 = time.perf_counter()
    s.launch()
    try:
        s.wait_ready(timeout=600, interval=0.05)
        return time.perf_counter() - t0
    finally:
        s.stop()
        s.remove_log()


def ask(http: httpx.Client) -> float:
    t0 = time.perf_counter()
    http.post("/v1/chat/completions", json=ASK).raise_for_status()
    return time.perf_counter() - t0


def wake_seconds(tmp: Path, repeats: int) -> dict[str, Any]:
    """Each wake: the first request after sleeping minus the same request awake."""
    s = server(tmp, "--sleep-idle-seconds", "1")
    s.start(timeout=600)
    http = httpx.Client(base_url=s.base_url, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=300)
    try:
        ask(http)
        extra = []
        for _ in range(repeats):
            while http.get("/v1/models").json()["data"][0]["state"] != "sleeping":
                time.sleep(0.1)
            time.sleep(1)  # the model's memory is freed
            woken = ask(http)
            extra.append(woken - ask(http))
        metrics = http.get("/metrics").text
    finally:
        http.close()
        s.stop()
        s.remove_log()

    def metric(name: str) -> float:
        line = next(x for x in metrics.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    total = metric("officellm:model_wake_seconds_sum")
    count = metric("officellm:model_wake_seconds_count")
    return {"request_extra_s": extra, "server_wake_mean_s": total / count if count else None}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = [], []
    for key, label in (("cold_start_s", "cold start"), ("warm_start_s", "warm start")):
        if doc[key]:
            labels.append(label)
            values.append(statistics.median(doc[key]))
    labels.append("wake from sleep")
    values.append(statistics.median(doc["wake"]["request_extra_s"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, values, color=["#b55", "#36c", "#3a3"][-len(labels):])
    ax.set_ylabel("seconds (median)")
    ax.set_title("bundled SmolLM2-135M: time to ready")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "model_load_time.json")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="model-load-time-"))
    start_seconds(tmp)  # the GGUF is converted and the kernels built once, before timing
    cold: list[float] = []
    for _ in range(args.repeats):
        if not drop_page_cache():
            print("cold start skipped: dropping the page cache needs root")
            cold = []
            break
        cold.append(start_seconds(tmp))
    warm = [start_seconds(tmp) for _ in range(args.repeats)]
    doc = {"machine": cpu_description(), "settings": vars(args) | {"out": str(args.out)},
           "cold_start_s": cold, "warm_start_s": warm, "wake": wake_seconds(tmp, args.repeats)}
    for key in ("cold_start_s", "warm_start_s"):
        if doc[key]:
            print(f"{key}: median {statistics.median(doc[key]):.2f} s {doc[key]}")
    wake = doc["wake"]
    print(f"wake from sleep: the request's extra median "
          f"{statistics.median(wake['request_extra_s']):.2f} s; the server's "
          f"model_wake_seconds mean {wake['server_wake_mean_s']:.2f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    plot(doc, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

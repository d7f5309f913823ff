"""An agent turn's resent prefix: the time to first token of Claude-Code-shaped requests, each
with a new billing nonce as Claude Code sends them, on `officellm serve` with the bundled model
(the office profile: the KV disk tier on, kv-cache/ in the run's data directory). The first
prefills the whole prompt; the second and third find its prefix in the pool's prefix cache
(the nonce block is dropped before rendering, docs/clients.md); the fourth comes after the
model's idle sleep and the fifth after a restart of the server, both finding the prefix in
the disk tier (docs/kv_tiers.md). Prints each TTFT and the ratios, writes
benchmarks/results/agent_prefix.json and .png.

The request is tests/server/recorded/claude_code_2.1.197.json (texts anonymised; its tools and
schemas as Claude Code sent them), `--tools` of its 24 tools kept, max_tokens 1.

    .venv/bin/python -m benchmarks.agent_prefix [--tools 24] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.machine import cpu_description

RESULTS = Path(__file__).parent / "results"
RECORDED = Path(__file__).parents[1] / "tests" / "server" / "recorded" / "claude_code_2.1.197.json"
KEY = "sk-agent-prefix-bench"
SLEEP_S = 5  # idle seconds before the model sleeps (the fourth request wakes it)


def first_token_s(base_url: str, body: dict, headers: dict) -> tuple[float, dict]:
    """Seconds to the first content event of a streamed message, and the message's usage."""
    t0 = time.perf_counter()
    first = None
    usage: dict = {}
    with httpx.stream("POST", f"{base_url}/v1/messages?beta=true", json=body, headers=headers,
                      timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if first is None and event["type"] in ("content_block_start", "message_delta"):
                first = time.perf_counter() - t0
            if event["type"] == "message_delta":
                usage = event["usage"]
    assert first is not None
    return first, usage


def _wait_until_asleep(base_url: str, headers: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30)
        if r.json()["data"][0]["state"] == "sleeping":
            return
        time.sleep(0.5)
    raise TimeoutError("the model did not go to sleep")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", type=int, default=24, help="how many of the recorded tools")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "agent_prefix.json")
    args = ap.parse_args()
    from officellm.loadgen.local_server import Server, free_port

    record = json.loads(RECORDED.read_text())
    body = {**record["body"], "max_tokens": 1, "tools": record["body"]["tools"][:args.tools]}
    headers = {**record["headers"], "x-api-key": KEY}
    data_dir = tempfile.mkdtemp(prefix="officellm-bench-")  # its own database, not the user's
    nonces = iter(f"{n:05x}" for n in range(1, 100))

    def ask(server) -> dict:
        system = [dict(b) for b in body["system"]]
        system[0]["text"] = system[0]["text"].replace("cch=00000", f"cch={next(nonces)}")
        ttft, usage = first_token_s(server.base_url, {**body, "system": system}, headers)
        return {"ttft_s": ttft, **usage}

    def serve() -> Server:
        port = free_port()
        server = Server("officellm-serve",
                        [sys.executable, "-m", "officellm.cli", "serve", "--port",
                         str(port), "--api-key", KEY, "--model-alias", "claude-*",
                         "--max-context-tokens", "0", "--num-threads", str(args.threads),
                         "--sleep-idle-seconds", str(SLEEP_S)],
                        dict(os.environ, OFFICELLM_DATA_DIR=data_dir), port)
        server.launch()
        server.wait_ready()
        return server

    runs: dict[str, dict] = {}
    try:
        server = serve()
        try:
            for name in ("cold", "warm", "warm again"):
                runs[name] = ask(server)
                print(f"{name}: first token after {runs[name]['ttft_s']:.2f} s, "
                      f"usage {runs[name]}")
            _wait_until_asleep(server.base_url, headers)
            runs["after sleep"] = ask(server)
            print(f"after sleep: first token after {runs['after sleep']['ttft_s']:.2f} s")
        finally:
            server.stop()
        server = serve()
        try:
            runs["after restart"] = ask(server)
            print(f"after restart: first token after {runs['after restart']['ttft_s']:.2f} s")
        finally:
            server.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    cold, warm = runs["cold"]["ttft_s"], runs["warm"]["ttft_s"]
    result = {
        "machine": cpu_description(), "client": record["client"], "tools": args.tools,
        "threads": args.threads, "runs": runs,
        "prompt_tokens": runs["cold"]["input_tokens"] + runs["cold"]["cache_read_input_tokens"],
        "warm_vs_cold": warm / cold,
        "after_restart_vs_warm": runs["after restart"]["ttft_s"] / warm,
        "cold_vs_after_restart": cold / runs["after restart"]["ttft_s"],
        "after_sleep_vs_warm": runs["after sleep"]["ttft_s"] / warm,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(list(runs), [r["ttft_s"] for r in runs.values()],
           color=["#888", "#3a7", "#3a7", "#37a", "#37a"])
    ax.set_yscale("log")
    ax.set_ylabel("time to first token, s (log)")
    ax.set_title(f"Claude Code's request ({result['prompt_tokens']:,} prompt tokens): after "
                 f"restart x{result['after_restart_vs_warm']:.1f} a warm hit, "
                 f"1/{result['cold_vs_after_restart']:.0f} of cold", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()

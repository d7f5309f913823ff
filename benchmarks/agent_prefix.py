"""An agent turn's resent prefix: the time to first token of three identical Claude-Code-shaped
requests, each with a new billing nonce as Claude Code sends them, on `officellm serve` with
the bundled model. The first prefills the whole prompt; the second and third find its prefix
in the prefix cache (the nonce block is dropped before rendering, docs/clients.md), so they
should start far sooner. Prints each TTFT and the ratios to the first, writes
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
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="officellm-bench-")  # its own database, not the user's
    server = Server("officellm-serve", [sys.executable, "-m", "officellm.app.cli", "serve",
                                        "--port", str(port), "--api-key", KEY,
                                        "--model-alias", "claude-*", "--max-context-tokens", "0",
                                        "--num-threads", str(args.threads)],
                    dict(os.environ, OFFICELLM_DATA_DIR=data_dir), port)
    server.launch()
    try:
        server.wait_ready()
        runs = []
        for nonce in ("1a2b3", "4c5d6", "7e8f9"):
            system = [dict(b) for b in body["system"]]
            system[0]["text"] = system[0]["text"].replace("cch=00000", f"cch={nonce}")
            ttft, usage = first_token_s(server.base_url, {**body, "system": system}, headers)
            runs.append({"ttft_s": ttft, **usage})
            print(f"request {len(runs)}: first token after {ttft:.2f} s, usage {usage}")
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {
        "machine": cpu_description(), "client": record["client"], "tools": args.tools,
        "threads": args.threads, "runs": runs,
        "prompt_tokens": runs[0]["input_tokens"] + runs[0]["cache_read_input_tokens"],
        "second_vs_first": runs[1]["ttft_s"] / runs[0]["ttft_s"],
        "third_vs_first": runs[2]["ttft_s"] / runs[0]["ttft_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(["1st (cold)", "2nd", "3rd"], [r["ttft_s"] for r in runs],
           color=["#888", "#3a7", "#3a7"])
    ax.set_ylabel("time to first token, s")
    ax.set_title(f"Claude Code's request resent ({result['prompt_tokens']:,} prompt tokens): "
                 f"2nd x{result['second_vs_first']:.3f}")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()

"""`officellm bench`: office-shaped load against any OpenAI-compatible chat server."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from officellm.loadgen import report
from officellm.loadgen.runner import Target, run_bench
from officellm.loadgen.scenarios import SCENARIOS, ScenarioConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="load-test a chat server with office workloads",
                       description="Streams chat completions the way an office does and reports "
                                   "TTFT, ITL, TPOT, end-to-end latency and throughput.")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="default: the first model of /v1/models")
    p.add_argument("--scenario", choices=SCENARIOS, default="office")
    p.add_argument("--users", type=int, default=4)
    bound = p.add_argument_group("bounds (at least one)")
    bound.add_argument("--duration", type=float, default=None, help="seconds")
    bound.add_argument("--requests", type=int, default=None, help="requests in all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=128, help="cap on a reply's length")
    p.add_argument("--think-time", type=float, default=2.0, help="mean seconds between turns")
    p.add_argument("--doc-tokens", type=int, default=6000, help="long-doc: the paste's size")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="shared-prefix: its size")
    p.add_argument("--file-tokens", type=int, default=1200,
                   help="code-edit: the size of the file each request asks to rewrite")
    nn = p.add_argument_group("noisy-neighbour (--users light users chat while one heavy user "
                              "floods; give it its own key, or the server sees one user)")
    nn.add_argument("--heavy-requests", type=int, default=8,
                    help="the heavy user's parallel long-context requests (K; 0: none)")
    nn.add_argument("--heavy-doc-tokens", type=int, default=4000,
                    help="each heavy request's document, in tokens")
    nn.add_argument("--heavy-max-tokens", type=int, default=64, help="its answers' cap")
    nn.add_argument("--heavy-start", type=float, default=0.0,
                    help="seconds into the run before the heavy user joins the light ones")
    nn.add_argument("--heavy-api-key", default=None,
                    help="the heavy user's key (default: --api-key)")
    p.add_argument("--max-context", type=int, default=None,
                   help="the server's context length when /v1/models does not say")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (officellm, vLLM and llama.cpp accept it) so replies "
                        "run to their drawn length")
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=Path("bench_results.json"))
    p.add_argument("--plot", type=Path, default=None, help="write latency CDFs here (PNG)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.duration is None and args.requests is None:
        raise ValueError("give --duration or --requests (the run must be bounded)")
    extra = json.loads(args.extra_body) if args.extra_body else {}
    if args.ignore_eos:
        extra["ignore_eos"] = True
    target = Target(args.base_url.rstrip("/"), args.api_key, args.model, args.max_context, extra,
                    args.request_timeout, heavy_api_key=args.heavy_api_key)
    config = ScenarioConfig(args.scenario, args.users, args.seed, args.max_tokens,
                            args.think_time, args.doc_tokens, args.prefix_tokens,
                            heavy_requests=args.heavy_requests,
                            heavy_doc_tokens=args.heavy_doc_tokens,
                            heavy_max_tokens=args.heavy_max_tokens,
                            heavy_start=args.heavy_start, file_tokens=args.file_tokens)
    result = asyncio.run(run_bench(target, config, args.requests, args.duration))
    doc = report.build(result)
    report.write(doc, args.out)
    if args.plot is not None:
        try:  # matplotlib is the `bench` extra: only --plot needs it
            from officellm.loadgen import plot
        except ImportError as exc:
            raise ValueError(f"--plot needs matplotlib (pip install 'officellm[bench]'): {exc}") from exc
        plot.plot({args.scenario: doc}, args.plot)
    print(report.text_summary(doc))
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0 if doc["summary"]["requests"]["completed"] > 0 else 1

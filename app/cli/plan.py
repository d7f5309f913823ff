"""`officellm plan MODEL`: the KV-cache arithmetic before you buy or launch."""

from __future__ import annotations

import argparse
import json

from officellm.engine import format_plan, load_spec, make_plan, parse_memory


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="KV-cache arithmetic for a model and a memory size",
                       description="How many tokens, and so how many chats, fit in memory.")
    p.add_argument("model", help="model directory, config.json, .gguf, or a shipped config name "
                                 "(e.g. Qwen2.5-7B-Instruct)")
    p.add_argument("--memory", default="80GiB", help="memory per GPU (default 80GiB)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32 (default bf16)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (the --dtype) | float16 | bfloat16 | fp8_e4m3 | fp8_e5m2 | int8: what "
                        "the KV cache is stored in (fp8 halves a 16-bit cache's bytes per token; "
                        "int8 adds a 4-byte scale per row)")
    p.add_argument("--avg-tokens", type=int, default=4000, help="a typical chat's length")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec, name = load_spec(args.model)
    plan = make_plan(spec, name, parse_memory(args.memory), args.dtype, args.max_model_len,
                     args.avg_tokens, args.block_size, args.tensor_parallel_size,
                     kv_cache_dtype=args.kv_cache_dtype)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0

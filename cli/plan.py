"""`officellm plan MODEL`: the KV-cache arithmetic before you buy or launch; with several
models or memory sizes, a table of how many chats of each length fit."""

from __future__ import annotations

import argparse
import json

from officellm.engine import (
    format_plan,
    gguf_weight_bytes,
    load_spec,
    make_plan,
    parse_memory,
    parse_offloading_size,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="KV-cache arithmetic for a model and a memory size",
                       description="How many tokens, and so how many chats, fit in memory. "
                                   "Several models, or several memory sizes separated by "
                                   "commas, print a table of the chats that fit at each "
                                   "--fit-lengths.")
    p.add_argument("model", nargs="+", help="model directory, config.json, .gguf, or a shipped "
                                            "config name (e.g. Qwen2.5-7B-Instruct)")
    p.add_argument("--memory", default="80GiB",
                   help="memory per GPU (default 80GiB); several, comma-separated, for a table")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32 (default bf16)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (the --dtype) | float16 | bfloat16 | fp8_e4m3 | fp8_e5m2 | int8: what "
                        "the KV cache is stored in (fp8 halves a 16-bit cache's bytes per token; "
                        "int8 adds a 4-byte scale per row)")
    p.add_argument("--avg-tokens", type=int, default=4000, help="a typical chat's length")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where the model runs (default cuda): on the cpu a .gguf's weights "
                        "are held in its blocks, as the file stores them")
    p.add_argument("--kv-offloading-size", default=None,
                   help="host RAM for the KV tier below the pool, in GiB or with a unit "
                        "(8GiB): the tokens of prefix cache it keeps beside the pool's")
    p.add_argument("--fit-lengths", default="8192,32768",
                   help="the chat lengths of the table's columns (default 8192,32768)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host_tier = parse_offloading_size(args.kv_offloading_size)
    if isinstance(host_tier, str):
        raise SystemExit("officellm plan: give --kv-offloading-size a size (auto is the "
                         "server's, by the machine it runs on)")
    memories = [m.strip() for m in args.memory.split(",") if m.strip()]
    plans = [make_plan(spec, name, parse_memory(memory), args.dtype, args.max_model_len,
                       args.avg_tokens, args.block_size, args.tensor_parallel_size,
                       kv_cache_dtype=args.kv_cache_dtype,
                       held_weight_bytes=gguf_weight_bytes(model, args.dtype, args.device,
                                                           args.tensor_parallel_size),
                       host_tier_bytes=host_tier or 0)
             for model in args.model for spec, name in [load_spec(model)]
             for memory in memories]
    if args.json:
        out = [p.to_dict() for p in plans]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    elif len(plans) == 1:
        print(format_plan(plans[0]))
    else:
        lengths = [int(n) for n in args.fit_lengths.split(",")]
        print(fit_table(plans, memories, lengths))
    return 0


def fit_table(plans: list, memories: list[str], lengths: list[int]) -> str:
    """A Markdown table: per model, its weights and the chats of each length that fit beside
    them in each memory size (0 where the weights alone do not fit)."""
    head = ["model", "weights"] + [f"{m}: {n // 1024}k" for m in memories for n in lengths]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i in range(0, len(plans), len(memories)):
        group = plans[i:i + len(memories)]
        cells = [group[0].model, f"{group[0].weight_bytes / 1024**3:.1f} GiB"]
        for plan in group:
            groups = plan.groups()
            for n in lengths:
                held = groups.blocks_held(n, plan.block_size)
                cells.append(f"{plan.num_blocks // held:,}" if plan.pool_bytes else "—")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)

"""The CPU MoE kernel (kernels/cpu/moe.cpp) on Qwen3-30B-A3B's experts: ms per call and the
memory speed it reads the experts at, against this machine's measured memory bandwidth.

Qwen3-30B-A3B's MoE layer: hidden 2048, expert intermediate 768, 128 experts, top-8. Each
call runs T tokens (1 and 4: users typing; 16, 64: a batch) with a fresh random routing, on
one of several stacked layers in turn, so that the experts a call reads come from memory,
not from the last-level cache (the layers together hold over twice it). Formats: Q4_K_M's
mix (gate/up Q4_K, down Q6_K), MXFP4 and Q8_0, each in GGUF's rows and in quant_pack's
layout per expert (the K-quants' packed blocks are larger: the bytes a call reads are
counted in the layout it reads). GB/s = the distinct experts' bytes a call reads / its time;
the bandwidth is the same process's: a read (torch.sum of a 2 GiB float32 buffer) and a copy
(read + write, as benchmarks/gpucheck/bandwidth.py counts it), on --threads threads. Each
instruction-set path runs in its own process (`--isa native avx2`). Writes
benchmarks/results/moe_kernel_speed.json and a PNG, with the CPU it ran on.

    .venv/bin/python benchmarks/moe_kernel_speed.py [--threads 2] [--isa native avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpucheck.bandwidth import copy_bandwidth  # noqa: E402
from benchmarks.machine import cpu_description, read_bandwidth, run_per_isa  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
HIDDEN, INTER, TOP_K = 2048, 768, 8
# (name, gate/up format, down format), GGUF type ids (kernels/reference/quant_reference.py).
MIXES = (("Q4_K_M (Q4_K + Q6_K)", 12, 14), ("MXFP4", 39, 39), ("Q8_0", 8, 8))


def expert_stacks(fmt13: int, fmt2: int, layers: int, experts: int, module) -> dict:
    """{layout: [ExpertWeights per layer]} of random blocks (valid scales) in each layout."""
    from officellm.kernels.reference.moe import ExpertWeights
    from officellm.kernels.reference.random_blocks import random_blocks

    gen = torch.Generator().manual_seed(0)
    rows, packed = [], []
    for _ in range(layers):
        w13 = random_blocks(experts * 2 * INTER, HIDDEN, fmt13, gen).reshape(experts, 2 * INTER, -1)
        w2 = random_blocks(experts * HIDDEN, INTER, fmt2, gen).reshape(experts, HIDDEN, -1)
        rows.append(ExpertWeights(w13, w2, fmt13, fmt2))
        packed.append(ExpertWeights(_pack(module, w13, fmt13), _pack(module, w2, fmt2),
                                    fmt13, fmt2))
    return {"rows": rows, "packed": packed}


def _pack(module, w: torch.Tensor, fmt: int) -> torch.Tensor:
    return torch.stack([module.quant_pack(w[e], fmt) for e in range(w.shape[0])])


def measure(tokens: list[int], calls: int, layers: int, experts: int, bandwidth_bytes: int
            ) -> dict:
    """This process's path: per mix, layout and T, ms per call and GB/s of experts read."""
    from officellm.kernels.build import cpu_kernels
    from officellm.kernels.ops import kernel_ops
    from officellm.kernels.reference.moe import ExpertActivation

    module = cpu_kernels.load()
    if module is None:
        raise SystemExit("the C++ kernels could not be built here (no compiler?)")
    ops = kernel_ops("cpu")
    act = ExpertActivation("silu")
    out: dict = {"path": module.quant_matmul_path(),
                 "read_GBps": read_bandwidth(bandwidth_bytes) / 1e9,
                 "copy_GBps": copy_bandwidth(torch.device("cpu"), bandwidth_bytes) / 1e9,
                 "mixes": {}}
    gen = torch.Generator().manual_seed(1)
    for name, fmt13, fmt2 in MIXES:
        stacks = expert_stacks(fmt13, fmt2, layers, experts, module)
        mix: dict = {}
        for layout, per_layer in stacks.items():
            if layout == "packed" and per_layer[0].w13.dim() == 3:
                continue  # this path packs nothing
            expert_bytes = per_layer[0].nbytes() / experts
            mix[layout] = {"layer_MB": per_layer[0].nbytes() / 1e6, "tokens": {}}
            for t in tokens:
                x = torch.randn(t, HIDDEN)
                routes = [torch.randn(t, experts, generator=gen).topk(TOP_K, dim=-1)
                          for _ in range(calls)]
                routes = [(torch.softmax(v, -1), i) for v, i in routes]
                ops.moe_experts(x, *routes[0], per_layer[0], act)  # warm-up
                times, read = [], 0.0
                for c, (w, ids) in enumerate(routes):
                    layer = per_layer[c % layers]
                    t0 = time.perf_counter()
                    ops.moe_experts(x, w, ids, layer, act)
                    times.append(time.perf_counter() - t0)
                    read += torch.unique(ids).numel() * expert_bytes
                # The median call, and the best (what the kernel does when no other process
                # takes its cores: a shared machine's medians carry the others' load).
                median, best = statistics.median(times), min(times)
                mix[layout]["tokens"][str(t)] = {
                    "ms": median * 1e3, "best_ms": best * 1e3, "MB_read": read / calls / 1e6,
                    "GBps": read / calls / median / 1e9, "best_GBps": read / calls / best / 1e9}
        out["mixes"][name] = mix
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", nargs="+", default=["native", "avx2"],
                   help="paths to run: native, or an OFFICELLM_CPU_ISA value (avx2, sse41)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--calls", type=int, default=40, help="timed calls per point")
    p.add_argument("--layers", type=int, default=3,
                   help="stacked layers the calls take in turn (to outgrow the cache)")
    p.add_argument("--experts", type=int, default=128, help="experts per layer (top-8 of them)")
    p.add_argument("--bandwidth-gib", type=float, default=2.0,
                   help="the bandwidth measurement's buffer (far larger than the caches)")
    p.add_argument("--out", type=Path, default=RESULTS / "moe_kernel_speed.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.tokens, args.calls, args.layers, args.experts,
                                 int(args.bandwidth_gib * 1024**3))))
        return
    paths = run_per_isa(__file__, args.isa, args.threads,
                        ["--child", "--threads", str(args.threads), "--calls", str(args.calls),
                         "--layers", str(args.layers), "--experts", str(args.experts),
                         "--bandwidth-gib", str(args.bandwidth_gib),
                         "--tokens", *map(str, args.tokens)])
    for isa, run in paths.items():
        print(f"\n{isa}: kernel path {run['path']}, {args.threads} threads; memory read "
              f"{run['read_GBps']:.1f} GB/s, copy {run['copy_GBps']:.1f} GB/s; ms per call "
              f"median (best), GB/s of expert bytes at the median (best), % of the read")
        for name, mix in run["mixes"].items():
            for layout, res in mix.items():
                cells = [f"T={t}: {r['ms']:.2f} ({r['best_ms']:.2f}) ms {r['GBps']:.1f} "
                         f"({r['best_GBps']:.1f}) GB/s {r['GBps'] / run['read_GBps']:.0%}"
                         for t, r in res["tokens"].items()]
                print(f"  {name:<21} {layout:<6} {res['layer_MB']:6.0f} MB/layer  "
                      + ", ".join(cells))
    result = {"benchmark": "moe_kernel_speed", "model": "Qwen3-30B-A3B experts",
              "load_average": os.getloadavg(),
              "shape": {"hidden": HIDDEN, "intermediate": INTER, "experts": args.experts,
                        "top_k": TOP_K},
              "threads": args.threads, "layers": args.layers, "calls": args.calls,
              "cpu": cpu_description(), "paths": paths}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(paths, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _plot(paths: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paths), figsize=(7 * len(paths), 4), squeeze=False)
    for ax, (isa, run) in zip(axes[0], paths.items()):
        for name, mix in run["mixes"].items():
            for layout, res in mix.items():
                ts = list(res["tokens"])
                ax.plot([int(t) for t in ts], [res["tokens"][t]["GBps"] for t in ts],
                        marker="o", label=f"{name} {layout}")
        ax.axhline(run["read_GBps"], color="k", linestyle="--", label="memory read")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per call (top-8)")
        ax.set_ylabel("GB/s of expert bytes read")
        ax.set_title(f"{isa} ({run['path']}): Qwen3-30B-A3B MoE experts")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

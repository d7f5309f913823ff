"""Weights in GGUF blocks vs dense on this CPU: the matmul `--quantization auto` decides on.

One matmul of a 1B-class model (Llama-3.2-1B's fused gate/up: 16,384 x 2,048), at 1, 4 and
16 rows of x (one user typing, a few, an office batch), timed in each format the C++ kernel
reads (kernels/cpu/quant_matmul.cpp: Q8_0, Q4_1, Q4_K, Q6_K) against torch's dense float32
and bfloat16 (oneDNN, the weight packed as the engine packs it) on the same weights. Each
instruction-set path runs in its own process (`--isa native avx2`: OFFICELLM_CPU_ISA caps
our kernels, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS torch's), so an AVX-512 machine
also shows what an AVX2-only CPU gets. Prints each time and the ratio dense / blocks (above
1: blocks faster), dense being what `--dtype auto` would compute in there (bf16 only with
bf16 matrix instructions); writes benchmarks/results/quant_matmul_speed.json and a PNG, with
the CPU it ran on.

    .venv/bin/python benchmarks/quant_matmul_speed.py [--threads 2] [--isa native avx2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description, run_per_isa  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# The flags under which `--dtype auto` may compute in bf16 (engine/precision/dtype_choice.py measures).
BF16_MATMUL = frozenset({"avx512_bf16", "amx_bf16"})


def _best_ms(fn, x: torch.Tensor, repeats: int) -> float:
    fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def measure(n: int, k: int, rows: list[int], repeats: int) -> dict:
    """This process's path (its OFFICELLM_CPU_ISA): ms per format and per row count."""
    from officellm.engine.models import packed_linear
    from officellm.kernels.build import cpu_kernels
    from officellm.kernels.cpu_features import cpu_features
    from officellm.kernels.reference import quant_reference as qr

    module = cpu_kernels.load()
    if module is None:
        raise SystemExit("the C++ kernels could not be built here (no compiler?)")
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.05
    blocks = {qr.NAMES[f]: (f, q(w)) for f, q in (
        (qr.Q8_0, qr.quantize_q8_0), (qr.Q4_1, qr.quantize_q4_1), (qr.Q4_K, qr.quantize_q4_k),
        (qr.Q6_K, qr.quantize_q6_k))}
    # In the layout the engine runs them in (the formats the kernel packs, packed at load).
    blocks = {name: (f, module.quant_pack(data, f)) for name, (f, data) in blocks.items()}
    w16 = w.to(torch.bfloat16)
    packed = (packed_linear.pack(w16)
              if packed_linear.can_pack(torch.device("cpu"), torch.bfloat16) else None)
    features = cpu_features()
    out: dict = {"path": module.quant_matmul_path(), "cpu_flags_seen": features.describe(),
                 "bf16_packed": packed is not None,
                 "dense_dtype": "bfloat16" if features.flags & BF16_MATMUL else "float32",
                 "rows": {}}
    for m in rows:
        x = torch.randn(m, k)
        ms = {"dense float32": _best_ms(lambda a: a @ w.t(), x, repeats),
              "dense bfloat16": _best_ms(
                  lambda a: packed_linear.linear(a.to(torch.bfloat16), w16, None, packed), x,
                  repeats)}
        for name, (fmt, data) in blocks.items():
            ms[name] = _best_ms(lambda a, f=fmt, d=data: module.quant_matmul(a, d, f), x, repeats)
        out["rows"][str(m)] = ms
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", nargs="+", default=["native", "avx2"],
                   help="paths to run: native, or an OFFICELLM_CPU_ISA value (avx2, sse41)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--shape", type=int, nargs=2, default=[16384, 2048], metavar=("N", "K"),
                   help="output and input features (K a multiple of 256)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS / "quant_matmul_speed.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    n, k = args.shape
    if args.child:
        torch.set_num_threads(args.threads)
        print(json.dumps(measure(n, k, args.rows, args.repeats)))
        return
    paths = run_per_isa(__file__, args.isa, args.threads,
                        ["--child", "--threads", str(args.threads), "--shape", str(n), str(k),
                         "--repeats", str(args.repeats), "--rows", *map(str, args.rows)])
    for isa, run in paths.items():
        print(f"\n{isa}: kernel path {run['path']}, dense in {run['dense_dtype']} "
              f"(bf16 packed: {run['bf16_packed']}; {n}x{k}, {args.threads} threads; ms, "
              f"ratio = dense / blocks)")
        for m, ms in run["rows"].items():
            dense = ms[f"dense {run['dense_dtype']}"]
            cells = [f"{name} {t:.3f}" + ("" if name.startswith("dense") else f" ({dense / t:.2f}x)")
                     for name, t in ms.items()]
            print(f"  {m:>2} rows: " + ", ".join(cells))
    result = {"benchmark": "quant_matmul_speed", "shape": [n, k], "threads": args.threads,
              "cpu": cpu_description(), "paths": paths}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(paths, args.out.with_suffix(".png"), n, k)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _plot(paths: dict, path: Path, n: int, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paths), figsize=(6 * len(paths), 4), squeeze=False)
    for ax, (isa, run) in zip(axes[0], paths.items()):
        rows = list(run["rows"])
        names = list(run["rows"][rows[0]])
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar([r + i * width for r in range(len(rows))],
                   [run["rows"][m][name] for m in rows], width, label=name)
        ax.set_xticks([r + 0.4 - width / 2 for r in range(len(rows))], [f"{m} rows" for m in rows])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"{isa} ({run['path']}): {n}x{k} matmul")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

"""What a 16-bit, fp8 or int8 KV cache costs in quality, on the bundled SmolLM2.

A fixed English text (benchmarks/data/kv_quality_text.txt) is fed through the engine's own
model and attention backend one token per step, as decodes, so every key and value the model
reads comes back from the paged cache in the dtype under test (a prefill would attend to the
fresh keys of its own chunk). For each `--kv-cache-dtype` it reports the text's perplexity
and, against the 16-bit cache and the float32 one, how often the most likely next token is
the same (top-1 agreement), and what one decode-attention call of the C++ kernel takes over
that cache at office scale (16 chats of 1,024 tokens, SmolLM2's heads: whether fewer bytes
also mean less time depends on whether the kernel waits on memory there). A benchmark,
not a test threshold: the numbers go to benchmarks/results/kv_cache_quality.json and a PNG,
with the CPU they ran on.

    .venv/bin/python benchmarks/kv_cache_quality.py [--kv-dtypes float32 fp8_e4m3 int8 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_description  # noqa: E402
from benchmarks.teacher_forcing import as_decodes  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TEXT = Path(__file__).parent / "data" / "kv_quality_text.txt"


def decode_attention_ms(cache_dtype: torch.dtype, spec, chats: int = 16, tokens: int = 1024,
                        block_size: int = 16) -> float | None:
    """Milliseconds of one paged decode-attention call of the C++ kernel (None without it)."""
    from officellm.kernels.build import cpu_kernels
    from officellm.kernels.reference import reference

    kernel = cpu_kernels.load()
    if kernel is None:
        return None
    g = torch.Generator().manual_seed(0)
    blocks = chats * tokens // block_size
    shape = (blocks + 1, block_size, spec.num_kv_heads, spec.head_dim)

    def cache() -> torch.Tensor:
        x = torch.randn(shape, generator=g)
        if cache_dtype == torch.int8:
            return reference.quantize_int8_rows(x)
        return reference.to_cache_dtype(x, cache_dtype)

    k, v = cache(), cache()
    q = torch.randn(chats, spec.num_heads, spec.head_dim, generator=g)
    tables = torch.arange(blocks).view(chats, -1)
    lens = torch.full((chats,), tokens, dtype=torch.long)
    for _ in range(3):
        kernel.paged_decode_attention(q, k, v, tables, lens, spec.head_dim ** -0.5)
    t0, n = time.perf_counter(), 20
    for _ in range(n):
        kernel.paged_decode_attention(q, k, v, tables, lens, spec.head_dim ** -0.5)
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-dtypes", nargs="+",
                    default=["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"])
    ap.add_argument("--dtype", default="float32", help="the model's compute dtype")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None, help="only the text's first N tokens")
    ap.add_argument("--out", type=Path, default=RESULTS / "kv_cache_quality.json")
    args = ap.parse_args()

    from officellm.engine import LLM
    from officellm.engine.loading.model_loader import resolve_model_dir
    from officellm.engine.precision.kv_cache_dtype import kv_dtype_name

    model_dir = resolve_model_dir(None)
    runs: dict[str, dict] = {}
    logprobs: dict[str, torch.Tensor] = {}
    ids: list[int] = []
    for kv in args.kv_dtypes:
        llm = LLM(str(model_dir), dtype=args.dtype, kv_cache_dtype=kv, quantization="none",
                  kv_cache_memory="64MiB", max_model_len=1024, num_threads=args.threads)
        core = llm.llm_engine.engine_core
        ids = llm.get_tokenizer().encode(TEXT.read_text())[: args.max_tokens]
        t0 = time.perf_counter()
        lp = as_decodes(llm, ids)
        target = torch.tensor(ids[1:])
        nll = -lp.gather(1, target[:, None]).mean().item()
        seconds = time.perf_counter() - t0
        name = kv_dtype_name(core.kv_dtype)
        logprobs[name] = lp
        attention_ms = decode_attention_ms(core.kv_dtype, core.spec)
        runs[name] = {"kv_cache_dtype": name, "bytes_per_token": core.bytes_per_token,
                      "perplexity": math.exp(nll), "seconds": seconds,
                      "backend": core.backend, "decode_attention_ms_16x1024": attention_ms}
        print(f"{name:>9}: {core.bytes_per_token:>6,} B/token  perplexity {math.exp(nll):.4f}"
              f"  decode attention (16 x 1,024 tokens) "
              + ("n/a" if attention_ms is None else f"{attention_ms:.2f} ms"), flush=True)
        del llm
    top1 = {name: lp.argmax(-1) for name, lp in logprobs.items()}
    for name, run in runs.items():
        for ref in ("float32", "float16"):
            if ref in top1 and ref != name:
                run[f"top1_agreement_vs_{ref}"] = (top1[name] == top1[ref]).float().mean().item()
        if "float16" in runs:
            run["perplexity_change_vs_float16"] = run["perplexity"] / runs["float16"]["perplexity"] - 1
    for run in runs.values():
        extras = "  ".join(f"{k.removeprefix('top1_agreement_')} top-1 {v:.2%}"
                           for k, v in run.items() if k.startswith("top1_agreement_"))
        change = run.get("perplexity_change_vs_float16")
        print(f"{run['kv_cache_dtype']:>9}: ppl {run['perplexity']:.4f}"
              + (f" ({change:+.2%} vs float16)" if change is not None else "") + f"  {extras}")
    result = {"benchmark": "kv_cache_quality", "model": model_dir.name, "dtype": args.dtype,
              "text_tokens": len(ids), "cpu": cpu_description(), "runs": list(runs.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(list(runs.values()), args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["kv_cache_dtype"] for r in runs]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    a.bar(names, [r["perplexity"] for r in runs], color="tab:blue")
    a.set_title("perplexity of the fixed text (lower is better)")
    a.set_ylim(min(r["perplexity"] for r in runs) * 0.98, max(r["perplexity"] for r in runs) * 1.01)
    b.bar(names, [r["bytes_per_token"] for r in runs], color="tab:green")
    b.set_title("KV cache bytes per token")
    c.bar(names, [r["decode_attention_ms_16x1024"] or 0 for r in runs], color="tab:orange")
    c.set_title("decode attention, 16 chats x 1,024 tokens (ms)")
    for ax in (a, b, c):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

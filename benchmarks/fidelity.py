"""How faithful each CPU path is to the model as written, beside llama.cpp on the same GGUF.

The reference is the GGUF dequantized to float32 and run dense with a float32 KV cache (the
model as its file defines it; officellm's float32 dense path, equal to transformers'). Each
officellm path reads a text (benchmarks/data/fidelity_text.txt, ~2,500 tokens) as
llama.cpp's `llama-perplexity` does: chunks of --ctx tokens (the first one BOS where the
tokenizer adds one), the second half of each chunk scored. For each path: the mean, median
and 99th percentile of the KL divergence of its next-token distribution from the
reference's, and how often its most likely token is the reference's (top-1 agreement). Each
path is read twice: as decodes, one token a step (how an answer is generated: at one row a
GGUF model's matmuls read its blocks) and as one prefill per chunk (how a prompt is read:
`--quantization auto` runs large batches on dense weights where it measured them faster).

llama.cpp's numbers come from its own tools on the same file and text: `llama-quantize
--allow-requantize FILE F32` gives its float32 reference, `llama-perplexity
--kl-divergence-base` saves that model's logits and `--kl-divergence` compares the GGUF's
with them (its "Mean KLD", "99.0% KLD" and "Same top p"). Build them with
benchmarks/build_llama_server.sh.

    .venv/bin/python benchmarks/fidelity.py [--model FILE.gguf] [--ctx 512] [--threads 2]

Results: benchmarks/results/fidelity_<model>.json and .png, with the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_description  # noqa: E402
from benchmarks.teacher_forcing import as_decodes, as_prefill  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TEXT = Path(__file__).parent / "data" / "fidelity_text.txt"
# name -> LLM settings; the reference first. "default" is what `officellm serve FILE` runs.
PATHS = {
    "reference (float32 dense)": dict(dtype="float32", quantization="none",
                                      kv_cache_dtype="float32"),
    "default": {},
    "float32 activations, blocks": dict(dtype="float32", quantization="gguf"),
    "bfloat16 activations, blocks": dict(dtype="bfloat16", quantization="gguf"),
}


def chunks_of(token_ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: whole --ctx windows, the first token BOS if one is added."""
    out = []
    for i in range(len(token_ids) // ctx):
        chunk = list(token_ids[i * ctx:(i + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def scored_logprobs(llm, chunks: list[list[int]], mode: str) -> torch.Tensor:
    """Each chunk's second half of next-token log-probabilities, stacked."""
    read = as_decodes if mode == "decode" else as_prefill
    return torch.cat([read(llm, chunk)[len(chunk) // 2:] for chunk in chunks])


def agreement(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    kl = (reference.exp() * (reference - other)).sum(-1)
    return {"kl_mean": kl.mean().item(), "kl_median": kl.median().item(),
            "kl_p99": kl.quantile(0.99).item(),
            "top1_agreement": (reference.argmax(-1) == other.argmax(-1)).float().mean().item(),
            "tokens": len(kl)}


def llama_tools() -> dict[str, Path]:
    cache = Path(os.environ.get("OFFICELLM_CACHE_DIR", Path.home() / ".cache" / "officellm"))
    found = {}
    for tool in ("llama-perplexity", "llama-quantize"):
        built = sorted(cache.glob(f"llama.cpp/*/build/bin/{tool}"))
        if built:
            found[tool] = built[-1]
    return found


def llama_cpp_fidelity(gguf: Path, text: Path, ctx: int, threads: int) -> dict | None:
    """llama.cpp's KL divergence and top-1 agreement of `gguf` against its float32 self."""
    tools = llama_tools()
    if len(tools) < 2:
        print("llama.cpp: llama-perplexity or llama-quantize not built "
              "(benchmarks/build_llama_server.sh): its row is left out")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        f32, base = Path(tmp) / "f32.gguf", Path(tmp) / "base.kld"
        subprocess.run([str(tools["llama-quantize"]), "--allow-requantize", str(gguf), str(f32),
                        "F32"], check=True, capture_output=True)
        common = ["-f", str(text), "-c", str(ctx), "-t", str(threads), "-b", str(ctx)]
        subprocess.run([str(tools["llama-perplexity"]), "-m", str(f32), *common,
                        "--kl-divergence-base", str(base)], check=True, capture_output=True)
        run = subprocess.run([str(tools["llama-perplexity"]), "-m", str(gguf), *common,
                              "--kl-divergence-base", str(base), "--kl-divergence"],
                             check=True, capture_output=True, text=True)
    log = run.stdout + run.stderr

    def number(label: str) -> float:
        match = re.search(rf"{re.escape(label)}\s*:\s*(-?[\d.]+)", log)
        if match is None:
            raise RuntimeError(f"llama-perplexity printed no {label!r}:\n{log[-2000:]}")
        return float(match.group(1))

    return {"kl_mean": number("Mean    KLD"), "kl_median": number("Median  KLD"),
            "kl_p99": number("99.0%   KLD"), "top1_agreement": number("Same top p") / 100}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf (default: the bundled one)")
    ap.add_argument("--text", type=Path, default=TEXT)
    ap.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama's -c)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--modes", nargs="+", default=["decode", "prefill"],
                    choices=["decode", "prefill"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from officellm.engine import LLM
    from officellm.engine.loading.model_loader import bundled_model_path

    gguf = args.model or bundled_model_path()
    cells: list[dict] = []
    reference: torch.Tensor | None = None
    chunks: list[list[int]] = []
    for name, settings in PATHS.items():
        llm = LLM(str(gguf), kv_cache_memory="256MiB", max_model_len=args.ctx + 16,
                  num_threads=args.threads, **settings)
        core = llm.llm_engine.engine_core
        if not chunks:
            tok = llm.get_tokenizer()
            ids = tok(args.text.read_text())["input_ids"]
            adds_bos = tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id]
            chunks = chunks_of(ids, args.ctx, tok.bos_token_id if adds_bos else None)
        described = (f"{str(core.dtype).removeprefix('torch.')}, weights {core.weight_format}, "
                     f"KV {str(core.kv_dtype).removeprefix('torch.')}")
        for mode in (["prefill"] if reference is None else args.modes):
            t0 = time.perf_counter()
            lp = scored_logprobs(llm, chunks, mode)
            seconds = time.perf_counter() - t0
            if reference is None:
                reference = lp
                print(f"{name}: {described}; {len(lp)} tokens scored", flush=True)
                break
            cell = {"path": name, "mode": mode, "engine": described, "seconds": seconds,
                    **agreement(reference, lp)}
            cells.append(cell)
            print(f"{name:>30} {mode:>7}: KL mean {cell['kl_mean']:.5f} median "
                  f"{cell['kl_median']:.5f} p99 {cell['kl_p99']:.4f}  top-1 "
                  f"{cell['top1_agreement']:.2%}  ({described})", flush=True)
        del llm
    llama = llama_cpp_fidelity(gguf, args.text, args.ctx, args.threads)
    if llama is not None:
        cells.append({"path": "llama.cpp", "mode": "prefill", "engine": "llama-perplexity "
                      "--kl-divergence against llama-quantize's F32 of the same file", **llama})
        print(f"{'llama.cpp':>30} {'prefill':>7}: KL mean {llama['kl_mean']:.5f} median "
              f"{llama['kl_median']:.5f} p99 {llama['kl_p99']:.4f}  top-1 "
              f"{llama['top1_agreement']:.2%}", flush=True)
    out = args.out or RESULTS / f"fidelity_{gguf.stem}.json"
    result = {"benchmark": "fidelity", "model": gguf.name, "text": args.text.name,
              "ctx": args.ctx, "chunks": len(chunks), "threads": args.threads,
              "cpu": cpu_description(), "cells": cells}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(cells, out.with_suffix(".png"), gguf.name)
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _plot(cells: list[dict], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c['path']}\n({c['mode']})" for c in cells]
    colors = ["tab:orange" if c["path"] == "llama.cpp" else "tab:blue" for c in cells]
    fig, (kl, top1) = plt.subplots(1, 2, figsize=(13, 4.8))
    kl.barh(labels, [c["kl_mean"] for c in cells], color=colors)
    kl.set_xlabel("mean KL divergence from the float32 model (lower is better)")
    top1.barh(labels, [100 * c["top1_agreement"] for c in cells], color=colors)
    top1.set_xlabel("top-1 agreement with the float32 model, % (higher is better)")
    top1.set_xlim(min(100 * c["top1_agreement"] for c in cells) - 2, 100)
    top1.set_yticks([])
    fig.suptitle(f"Fidelity to the float32 model: {model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

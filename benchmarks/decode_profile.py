"""Where one user's decode token goes on the CPU: ms per token by part of the model.

One request, greedy, --tokens tokens after a short prompt, offline (`LLM.generate`, no
server), on --model (a GGUF; e.g. the Qwen3-30B-A3B-shaped one of
benchmarks/real_shape_gguf.py). Each part is timed around its real call, whole steps
included:
  moe_experts       the MoE kernel (kernels/cpu/moe.cpp), all layers
  moe_routing       the rest of the MoE module: router matmul and top-k
  layer_matmuls     the layers' matmuls over GGUF blocks (qkv, o, dense MLPs)
  lm_head           the output head's matmul
  other             everything else: norms, rotary, attention, the Python of the layers, the
                    engine loop, sampling and detokenization
Torch's huge-page allocation (THP_MEM_ALLOC_ENABLE, as the `officellm` command sets it) is on
unless the environment says otherwise. Writes benchmarks/results/decode_profile.json and a PNG,
with the CPU.

    .venv/bin/python -m benchmarks.decode_profile --model FILE.gguf [--tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PARTS = ("moe_experts", "moe_routing", "layer_matmuls", "lm_head", "other")


def profile(model: Path, tokens: int, threads: int) -> dict:
    """ms per token of each part (PARTS), and the total."""
    from officellm.engine import LLM, SamplingParams
    from officellm.engine.models.moe import MixtureOfExperts
    from officellm.engine.models.quantized_linear import QuantizedWeight

    llm = LLM(str(model), max_model_len=2048, num_threads=threads)
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    seconds: dict[str, float] = defaultdict(float)
    head_rows = llm.llm_engine.engine_core.model.spec.vocab_size

    def timed(part, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - t0
        return run

    moe_forward, matmul = MixtureOfExperts.forward, QuantizedWeight.__call__

    def moe(self, x, moe_experts):
        return moe_forward(self, x, timed("moe_experts", moe_experts))

    def blocks(self, x):
        rows = sum(g.data.shape[0] * (8 if g.data.dim() == 3 else 1) for g in self.groups)
        return timed("lm_head" if rows >= head_rows else "layer_matmuls", matmul)(self, x)

    MixtureOfExperts.forward = timed("moe_module", moe)
    QuantizedWeight.__call__ = blocks
    try:
        t0 = time.perf_counter()
        llm.generate([[1, 2, 3, 4]], greedy)
        total = time.perf_counter() - t0
    finally:
        MixtureOfExperts.forward, QuantizedWeight.__call__ = moe_forward, matmul
    parts = {"moe_experts": seconds["moe_experts"],
             "moe_routing": seconds["moe_module"] - seconds["moe_experts"],
             "layer_matmuls": seconds["layer_matmuls"], "lm_head": seconds["lm_head"]}
    parts["other"] = total - sum(parts.values())
    return {"ms_per_token": 1000 * total / tokens,
            "parts_ms_per_token": {k: 1000 * v / tokens for k, v in parts.items()}}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = result["parts_ms_per_token"]
    fig, ax = plt.subplots(figsize=(7, 3))
    left = 0.0
    for name in PARTS:
        ax.barh([0], [parts[name]], left=left, label=name)
        left += parts[name]
    ax.set_yticks([])
    ax.set_xlabel("ms per decode token (one user)")
    ax.set_title(f"{Path(result['model']).name}: {result['ms_per_token']:.1f} ms/token")
    ax.legend(ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a GGUF file")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "decode_profile.json")
    args = p.parse_args()
    # Read by torch's allocator once, before its first allocation: set before torch loads.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    from benchmarks.machine import cpu_description

    result = {"model": str(args.model), "tokens": args.tokens, "threads": args.threads,
              "huge_pages": os.environ["THP_MEM_ALLOC_ENABLE"], "machine": cpu_description()}
    result |= profile(args.model, args.tokens, args.threads)
    for name, ms in result["parts_ms_per_token"].items():
        print(f"{name:14s} {ms:7.2f} ms/token")
    print(f"{'total':14s} {result['ms_per_token']:7.2f} ms/token")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

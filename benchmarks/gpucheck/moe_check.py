"""The MoE experts kernel (kernels/triton/fused_moe.py) on the device, for (a): against the
reference at Qwen3-30B-A3B's and gpt-oss-20b's shapes, dense and MXFP4; and one layer's
decode step, captured in a CUDA graph, timed as the bandwidth it achieves over the expert
bytes it must read.

MXFP4 experts are random GGUF blocks (exponent bytes near 2**-7, random nibbles) with their
values decoded here from the format's definition, independently of the kernel, so the
reference runs on exactly the weights the kernel dequantizes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from officellm.kernels.reference import moe as reference
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights
from officellm.kernels.triton.fused_moe import MXFP4

# e2m1 values doubled: each 17-byte block is 2**(e - 128) times these (see fused_moe.py).
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@dataclass(frozen=True)
class Layer:
    experts: int
    top_k: int
    hidden: int
    inter: int
    activation: str
    bias: bool


LAYERS = {"qwen3-30b-a3b": Layer(128, 8, 2048, 768, "silu", False),
          "gpt-oss-20b": Layer(32, 4, 2880, 2880, "clamped_swiglu", True)}
TOY = Layer(8, 2, 64, 32, "clamped_swiglu", True)  # the CPU smoke run's


def _mxfp4(experts: int, rows: int, k: int, device: torch.device,
           g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(random MXFP4 blocks uint8 [experts, rows, k / 32 * 17], their values float32)."""
    n = k // 32
    exps = torch.randint(119, 123, (experts, rows, n, 1), generator=g, dtype=torch.uint8)
    packed = torch.randint(0, 256, (experts, rows, n, 16), generator=g, dtype=torch.uint8)
    blocks = torch.cat([exps, packed], dim=-1).reshape(experts, rows, n * 17).to(device)
    nibbles = torch.cat([packed & 15, packed >> 4], dim=-1).to(device)  # weights 0-15, 16-31
    table = torch.tensor(MXFP4_VALUES, dtype=torch.float32, device=device)
    exps = exps.to(device).int()
    scale = torch.ldexp(torch.ones(exps.shape, device=device), exps - 128)
    return blocks, (table[nibbles.int()] * scale).reshape(experts, rows, k)


def random_layer(layer: Layer, dtype: torch.dtype, device: torch.device, mxfp4: bool,
                 seed: int = 0, values: bool = True) -> tuple[ExpertWeights, ExpertWeights | None]:
    """(the experts as moe_experts takes them, the same as dense weights in dtype for the
    reference, or None if not `values`)."""
    g = torch.Generator().manual_seed(seed)
    e, h, i = layer.experts, layer.hidden, layer.inter
    b13 = torch.randn(e, 2 * i, generator=g).to(device) if layer.bias else None
    b2 = torch.randn(e, h, generator=g).to(device) if layer.bias else None
    if not mxfp4:
        w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(device, dtype)
        w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(device, dtype)
        dense = ExpertWeights(w13, w2, b13=b13, b2=b2)
        return dense, dense if values else None
    w13, v13 = _mxfp4(e, 2 * i, h, device, g)
    w2, v2 = _mxfp4(e, h, i, device, g)
    dense = ExpertWeights(v13.to(dtype), v2.to(dtype), b13=b13, b2=b2) if values else None
    return ExpertWeights(w13, w2, MXFP4, MXFP4, b13, b2), dense


def _routed(layer: Layer, tokens: int, dtype: torch.dtype, device: torch.device,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, layer.hidden, generator=g).to(device, dtype)
    logits = torch.randn(tokens, layer.experts, generator=g).to(device)
    weights, ids = reference.route(logits, layer.top_k, "softmax_topk", True)
    return x, weights, ids


def comparisons(tri: Any, device: torch.device, dtype: torch.dtype,
                smoke: bool) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(case name, moe_experts' output, the reference's): each layer dense, gpt-oss's also
    MXFP4 (16-bit activations; 8 of its experts, enough for top-4), token counts that take
    the decode and the prefill tiles."""
    plans = [("toy", TOY, False), ("toy", TOY, True)] if smoke else [
        ("qwen3-30b-a3b", LAYERS["qwen3-30b-a3b"], False),
        ("gpt-oss-20b", LAYERS["gpt-oss-20b"], False),
        ("gpt-oss-20b, 8 experts", Layer(8, 4, 2880, 2880, "clamped_swiglu", True), True)]
    for name, layer, mxfp4 in plans:
        if mxfp4 and dtype == torch.float32 and not smoke:
            continue
        experts, dense = random_layer(layer, dtype, device, mxfp4)
        activation = ExpertActivation(layer.activation)
        for tokens in (5,) if smoke else (1, 37) if dtype == torch.float32 else (1, 37, 600):
            x, weights, ids = _routed(layer, tokens, dtype, device, seed=tokens)
            got = tri.moe_experts(x, weights, ids, experts, activation)
            want = reference.moe_experts(x, weights, ids, dense, activation)
            yield (f"moe_experts ({name}, {'MXFP4' if mxfp4 else 'dense'}, {tokens} tokens)",
                   got, want)
        del experts, dense


def _expert_bytes(experts: ExpertWeights) -> int:
    return experts.nbytes() // experts.num_experts


def decode_timing(device: torch.device, smoke: bool, copy_bandwidth: float) -> list[dict]:
    """One MoE layer's decode step at batch 1, 16 and 64, bf16: Qwen3-30B-A3B's dense
    experts and gpt-oss-20b's MXFP4 ones. Timed as CUDA-graph replays (a decode step is
    captured; the replay must equal the eager call); bytes are those of the distinct
    experts the routing picked."""
    from officellm.kernels.triton import ops as tri

    cuda = device.type == "cuda"
    rows = []
    plans = [("toy", TOY, True)] if smoke else [("qwen3-30b-a3b", LAYERS["qwen3-30b-a3b"], False),
                                                ("gpt-oss-20b", LAYERS["gpt-oss-20b"], True)]
    dtype = torch.bfloat16 if cuda else torch.float32
    for name, layer, mxfp4 in plans:
        experts, _ = random_layer(layer, dtype, device, mxfp4, values=False)
        activation = ExpertActivation(layer.activation)
        for batch in (1,) if smoke else (1, 16, 64):
            x, weights, ids = _routed(layer, batch, dtype, device, seed=batch)
            eager = tri.moe_experts(x, weights, ids, experts, activation)  # compiles
            read = int(ids.unique().numel()) * _expert_bytes(experts)
            row: dict[str, Any] = {"layer": name, "weights": "MXFP4" if mxfp4 else "bf16",
                                   "batch": batch, "expert_bytes": read}
            if cuda:
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = tri.moe_experts(x, weights, ids, experts, activation)
                graph.replay()
                torch.cuda.synchronize(device)
                row["graph_matches_eager"] = bool(torch.equal(out, eager))
                iters = 50
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(iters):
                    graph.replay()
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 1000 / iters
            else:
                t0 = time.perf_counter()
                tri.moe_experts(x, weights, ids, experts, activation)
                seconds = time.perf_counter() - t0
            row.update(us=seconds * 1e6, GBps=read / seconds / 1e9,
                       vs_copy=read / seconds / copy_bandwidth)
            rows.append(row)
        del experts
    return rows

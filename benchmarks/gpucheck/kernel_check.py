"""(a) Every Triton kernel against its torch reference on the device, bf16 included.

Random inputs, odd lengths, block boundaries, GQA ratios 1/4/8, head dims 64/128. Each case
records its largest absolute error against the tolerance of its dtype.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kernels import reference

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest error relative to max(1, |want|): absolute near zero, relative when large."""
    got, want = got.float().cpu(), want.float().cpu()
    return float(((got - want).abs() / want.abs().clamp(min=1.0)).max()) if got.numel() else 0.0


def _case(results: list, name: str, dtype: torch.dtype, got, want) -> None:
    err = _err(got, want)
    results.append({"kernel": name, "dtype": str(dtype).removeprefix("torch."), "max_err": err,
                    "tol": TOL[dtype], "ok": bool(err <= TOL[dtype])})


def _elementwise(tri: Any, dev: torch.device, dtype: torch.dtype, out: list, smoke: bool) -> None:
    t, h, d = (5, 64, 16) if smoke else (37, 3584, 128)
    x = torch.randn(t, h, dtype=dtype, device=dev) * 3
    r = torch.randn(t, h, dtype=dtype, device=dev)
    w = torch.randn(h, dtype=dtype, device=dev)
    _case(out, "rms_norm", dtype, tri.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    got = tri.fused_add_rms_norm(x, r, w, 1e-6)
    want = reference.fused_add_rms_norm(x, r, w, 1e-6)
    _case(out, "fused_add_rms_norm", dtype, got[0], want[0])
    _case(out, "fused_add_rms_norm.residual", dtype, got[1], want[1])
    hq, hk = (4, 2) if smoke else (28, 4)
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dtype, device=dev)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    cos, sin = torch.randn(t, d, device=dev), torch.randn(t, d, device=dev)
    got_q, got_k = tri.apply_rotary(q, k, cos, sin)
    want_q, want_k = reference.apply_rotary(q, k, cos, sin)
    _case(out, "apply_rotary.q", dtype, got_q, want_q)
    _case(out, "apply_rotary.k", dtype, got_k, want_k)
    g = torch.randn(t, 2 * (48 if smoke else 18944), dtype=dtype, device=dev) * 4
    _case(out, "silu_and_mul", dtype, tri.silu_and_mul(g), reference.silu_and_mul(g))
    kc = torch.zeros(9, 16, hk, d, dtype=dtype, device=dev)
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    slots = torch.randperm(9 * 16, device=dev)[:t]
    slots[::3] = -1
    tri.write_kv_cache(k, k, kc, vc, slots)
    reference.write_kv_cache(k, k, kc2, vc2, slots)
    _case(out, "write_kv_cache", dtype, torch.cat([kc, vc]), torch.cat([kc2, vc2]))


def _attention(tri: Any, dev: torch.device, dtype: torch.dtype, out: list, smoke: bool) -> None:
    from tests.kernels.paged_inputs import make_problem, reference_output

    groups = [(2, 2), (4, 1), (8, 1)] if smoke else [(8, 8), (16, 4), (32, 4)]
    dims = [16, 32] if smoke else [64, 128]
    decode_lens = [1, 17, 45] if smoke else [1, 17, 255, 1000, 4097]
    mixed = [(21, 21), (37, 11), (30, 1)] if smoke else [(300, 300), (517, 77), (1024, 256),
                                                          (33, 1), (4096, 16)]
    for hq, hk in groups:
        for d in dims:
            tag = f"GQA {hq // hk}, D {d}"
            p = make_problem([(n, 1) for n in decode_lens], hq, hk, d, dtype, dev)
            got = tri.paged_decode_attention(p.q, p.k_cache, p.v_cache, p.block_tables,
                                             p.seq_lens, p.scale)
            _case(out, f"paged_decode_attention ({tag})", dtype, got, reference_output(p))
            p = make_problem(mixed, hq, hk, d, dtype, dev, seed=1)
            got = tri.paged_prefill_attention(p.q, p.k_cache, p.v_cache, p.block_tables,
                                              p.seq_lens, p.query_start_loc, p.scale)
            _case(out, f"paged_prefill_attention ({tag})", dtype, got, reference_output(p))


def run(device: torch.device, smoke: bool) -> dict:
    """All kernel cases; on a CPU only under TRITON_INTERPRET=1, in fp32/fp16."""
    from kernels import triton_ops as tri

    t0 = time.perf_counter()
    dtypes = [torch.float32, torch.float16]
    if device.type == "cuda":
        dtypes.append(torch.bfloat16)
    torch.manual_seed(0)
    cases: list[dict] = []
    for dtype in dtypes:
        _elementwise(tri, device, dtype, cases, smoke)
        _attention(tri, device, dtype, cases, smoke)
    return {"cases": cases, "all_ok": all(c["ok"] for c in cases),
            "seconds": time.perf_counter() - t0}

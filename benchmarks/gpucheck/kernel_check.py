"""(a) Every Triton kernel against its torch reference on the device, bf16 included.

Random inputs, odd lengths, block boundaries, GQA ratios 1/4/8, head dims 64/128, the
one-byte KV caches (fp8_e4m3, fp8_e5m2, int8); sliding windows and attention sinks on
Gemma-3-like and gpt-oss heads (the blocks before each window NaN, so a read shows), partial
rotary and GELU(tanh)-and-mul; and the MoE experts (dense and MXFP4, moe_check.py). Each case
records its largest absolute error against the tolerance of its dtype. One MoE layer's
decode step is timed too.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from officellm.kernels.reference import reference

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
    r = 3 * d // 4  # partial rotary (Phi-4-mini's share)
    got_q, got_k = tri.apply_rotary(q, k, cos[:, :r], sin[:, :r])
    want_q, want_k = reference.apply_rotary(q, k, cos[:, :r], sin[:, :r])
    _case(out, "apply_rotary.q (partial)", dtype, got_q, want_q)
    _case(out, "apply_rotary.k (partial)", dtype, got_k, want_k)
    g = torch.randn(t, 2 * (48 if smoke else 18944), dtype=dtype, device=dev) * 4
    _case(out, "silu_and_mul", dtype, tri.silu_and_mul(g), reference.silu_and_mul(g))
    _case(out, "gelu_tanh_and_mul", dtype, tri.gelu_tanh_and_mul(g),
          reference.gelu_tanh_and_mul(g))
    ours, ref = _write_both(tri, k, k, torch.zeros(9, 16, hk, d, dtype=dtype, device=dev))
    _case(out, "write_kv_cache", dtype, torch.cat(ours), torch.cat(ref))


def _write_both(tri: Any, k: torch.Tensor, v: torch.Tensor,
                empty: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """((k cache, v cache) written by the Triton kernel, the same by the reference), each
    starting as `empty`, at random slots with every third one padding (-1)."""
    kc, vc, kc2, vc2 = (empty.clone() for _ in range(4))
    slots = torch.randperm(empty.shape[0] * empty.shape[1], device=empty.device)[:k.shape[0]]
    slots[::3] = -1
    tri.write_kv_cache(k, v, kc, vc, slots)
    reference.write_kv_cache(k, v, kc2, vc2, slots)
    return (kc, vc), (kc2, vc2)


def _attention(tri: Any, dev: torch.device, dtype: torch.dtype, out: list, smoke: bool) -> None:
    from officellm.kernels.reference.paged_problems import make_problem, reference_output

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


# (name, query heads, KV heads, head size, window, sinks?): the families with sliding-window
# layers (kernels/triton/compile_check.py's FEATURE_LAYOUTS).
FEATURE_LAYOUTS = [("Gemma-3-like", 8, 4, 256, 1024, False), ("gpt-oss", 64, 8, 64, 128, True)]


def _window_and_sinks(tri: Any, dev: torch.device, dtype: torch.dtype, out: list,
                      smoke: bool) -> None:
    """Decode (split-K) and prefill with each layout's sliding window (and sinks) over its
    own dtype's cache and an int8 one, the blocks before each window the null block full of
    NaN bytes; and the same layouts' full-attention layers."""
    from officellm.kernels.reference.paged_problems import (
        hidden_by_window,
        make_problem,
        reference_output,
        stored_as,
    )

    layouts = ([("Gemma-3-like", 2, 1, 32, 16, False), ("gpt-oss", 8, 1, 16, 8, True)] if smoke
               else FEATURE_LAYOUTS)
    decode_lens = [1, 17, 45] if smoke else [1, 17, 255, 1000, 4097]
    mixed = [(21, 21), (37, 11), (30, 1)] if smoke else [(300, 300), (517, 77), (4096, 16),
                                                          (33, 1)]
    for name, hq, hk, d, window, has_sinks in layouts:
        sinks = torch.randn(hq, device=dev) * 2 if has_sinks else None
        for cache_dtype in (dtype, torch.int8):
            for w in (window, 0):
                tag = (f"{name}, {'window ' + str(w) if w else 'full'}"
                       f"{', sinks' if has_sinks else ''}, "
                       f"{str(cache_dtype).removeprefix('torch.')} cache")
                for kind, seqs in (("decode", [(n, 1) for n in decode_lens]), ("prefill", mixed)):
                    p = make_problem(seqs, hq, hk, d, dtype, dev, seed=4)
                    stored, rounded = (stored_as(p, cache_dtype) if cache_dtype == torch.int8
                                       else (p, p))
                    run = hidden_by_window(stored, w) if w else stored
                    if kind == "decode":
                        got = tri.paged_decode_attention(run.q, run.k_cache, run.v_cache,
                                                         run.block_tables, run.seq_lens,
                                                         run.scale, window=w, sinks=sinks)
                    else:
                        got = tri.paged_prefill_attention(run.q, run.k_cache, run.v_cache,
                                                          run.block_tables, run.seq_lens,
                                                          run.query_start_loc, run.scale,
                                                          window=w, sinks=sinks)
                    _case(out, f"paged_{kind}_attention ({tag})", dtype, got,
                          reference_output(rounded, w or None, sinks))


# --kv-cache-dtype fp8_e4m3 / fp8_e5m2 / int8: the caches one byte per value holds.
ONE_BYTE_CACHES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)


def _written_alike(ours: torch.Tensor, ref: torch.Tensor, cache_dtype: torch.dtype,
                   d: int) -> tuple[bool, float]:
    """(agree?, how far): fp8 bytes equal; int8 integers at most one step apart in under 1%
    of values (a GPU's 127 / amax may round an ulp apart) and scales close."""
    if cache_dtype != torch.int8:
        same = torch.equal(ours.view(torch.uint8).cpu(), ref.view(torch.uint8).cpu())
        return same, 0.0 if same else 1.0
    steps = (ours[..., :d].int() - ref[..., :d].int()).abs().cpu()
    scales = [t[..., d:].contiguous().view(torch.float32).cpu() for t in (ours, ref)]
    scale_ok = torch.allclose(scales[0], scales[1], rtol=1e-6, atol=0.0)
    off = float((steps > 0).float().mean())
    return bool(steps.max() <= 1 and off < 0.01 and scale_ok), off


def _one_byte_caches(tri: Any, dev: torch.device, dtype: torch.dtype, out: list,
                     smoke: bool) -> None:
    """The write kernel's bytes, and decode/prefill attention over a one-byte cache against
    the reference over the values that cache holds."""
    from officellm.kernels.reference.paged_problems import make_problem, reference_output, stored_as

    hq, hk, d = (4, 2, 16) if smoke else (28, 4, 128)
    t = 5 if smoke else 37
    decode_lens = [1, 17, 45] if smoke else [1, 17, 255, 1000, 4097]
    mixed = [(21, 21), (37, 11), (30, 1)] if smoke else [(300, 300), (517, 77), (4096, 16)]
    for cache_dtype in ONE_BYTE_CACHES:
        name = str(cache_dtype).removeprefix("torch.")
        width = d + 4 if cache_dtype == torch.int8 else d
        k = torch.randn(t, hk, d, dtype=dtype, device=dev) * 30
        v = torch.randn(t, hk, d, dtype=dtype, device=dev)
        (kc, vc), (kc2, vc2) = _write_both(
            tri, k, v, torch.zeros(9, 16, hk, width, dtype=cache_dtype, device=dev))
        ok_k, off_k = _written_alike(kc, kc2, cache_dtype, d)
        ok_v, off_v = _written_alike(vc, vc2, cache_dtype, d)
        out.append({"kernel": f"write_kv_cache ({name} cache)",
                    "dtype": str(dtype).removeprefix("torch."), "max_err": max(off_k, off_v),
                    "tol": 0.01 if cache_dtype == torch.int8 else 0.0, "ok": ok_k and ok_v})
        for kind, seqs in (("decode", [(n, 1) for n in decode_lens]), ("prefill", mixed)):
            p = make_problem(seqs, hq, hk, d, dtype, dev, seed=2)
            stored, rounded = stored_as(p, cache_dtype)
            if kind == "decode":
                got = tri.paged_decode_attention(stored.q, stored.k_cache, stored.v_cache,
                                                 stored.block_tables, stored.seq_lens,
                                                 stored.scale)
            else:
                got = tri.paged_prefill_attention(stored.q, stored.k_cache, stored.v_cache,
                                                  stored.block_tables, stored.seq_lens,
                                                  stored.query_start_loc, stored.scale)
            _case(out, f"paged_{kind}_attention ({name} cache, GQA {hq // hk}, D {d})", dtype,
                  got, reference_output(rounded))


def _rotary_write_kv(tri: Any, dev: torch.device, dtype: torch.dtype, out: list,
                     smoke: bool) -> None:
    """The rotary fused with the KV write, per cache dtype: q and both caches byte for byte
    those of Triton's apply_rotary then write_kv_cache (its contract; those two are checked
    against the reference above), and q and a cache in the activation dtype against the
    reference's rotary then write."""
    hq, hk, d = (4, 2, 16) if smoke else (28, 4, 128)
    t = 5 if smoke else 37
    # Every cache dtype with whole rotary, and the activation dtype's and int8's with partial
    # rotary (R = 3/4 D: the rest of each key row stored unrotated, inside an int8 row's scale).
    for cache_dtype, r in [*((c, d) for c in (dtype, *ONE_BYTE_CACHES)),
                           (dtype, 3 * d // 4), (torch.int8, 3 * d // 4)]:
        name = str(cache_dtype).removeprefix("torch.")
        part = " (partial rotary)" if r < d else ""
        qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dtype, device=dev) * 4
        q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=-1))
        cos, sin = torch.randn(t, r, device=dev), torch.randn(t, r, device=dev)
        width = d + 4 if cache_dtype == torch.int8 else d
        empty = torch.zeros(9, 16, hk, width, dtype=cache_dtype, device=dev)
        kc, vc, kc2, vc2 = (empty.clone() for _ in range(4))
        slots = torch.randperm(empty.shape[0] * empty.shape[1], device=dev)[:t]
        slots[::3] = -1
        got_q = tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, slots)
        two_q, two_k = tri.apply_rotary(q, k, cos, sin)
        tri.write_kv_cache(two_k, v, kc2, vc2, slots)
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                   for a, b in ((got_q, two_q), (kc, kc2), (vc, vc2)))
        out.append({"kernel": f"rotary_write_kv{part} ({name} cache) == apply_rotary + "
                              "write_kv_cache",
                    "dtype": str(dtype).removeprefix("torch."), "max_err": 0.0 if same else 1.0,
                    "tol": 0.0, "ok": same})
        if cache_dtype == dtype:
            want_q, want_k = reference.apply_rotary(q, k, cos, sin)
            kc3, vc3 = empty.clone(), empty.clone()
            reference.write_kv_cache(want_k, v, kc3, vc3, slots)
            _case(out, f"rotary_write_kv.q{part}", dtype, got_q, want_q)
            _case(out, f"rotary_write_kv.caches{part}", dtype, torch.cat([kc, vc]),
                  torch.cat([kc3, vc3]))


def _moe(tri: Any, dev: torch.device, dtype: torch.dtype, out: list, smoke: bool) -> None:
    from benchmarks.gpucheck import moe_check

    for name, got, want in moe_check.comparisons(tri, dev, dtype, smoke):
        _case(out, name, dtype, got, want)


def run(device: torch.device, smoke: bool) -> dict:
    """All kernel cases; on a CPU only under TRITON_INTERPRET=1, in fp32/fp16. Also one MoE
    layer's decode step timed (moe_check.decode_timing)."""
    from benchmarks.gpucheck import bandwidth, moe_check
    from officellm.kernels.triton import ops as tri

    t0 = time.perf_counter()
    dtypes = [torch.float32, torch.float16]
    if device.type == "cuda":
        dtypes.append(torch.bfloat16)
    torch.manual_seed(0)
    cases: list[dict] = []
    for dtype in dtypes:
        _elementwise(tri, device, dtype, cases, smoke)
        _rotary_write_kv(tri, device, dtype, cases, smoke)
        _attention(tri, device, dtype, cases, smoke)
        _window_and_sinks(tri, device, dtype, cases, smoke)
        _one_byte_caches(tri, device, dtype, cases, smoke)
        _moe(tri, device, dtype, cases, smoke)
    copy = bandwidth.copy_bandwidth(device, 2 * 1024**3 if device.type == "cuda" else 2**22)
    moe_decode = moe_check.decode_timing(device, smoke, copy)
    graphs_ok = all(r.get("graph_matches_eager", True) for r in moe_decode)
    return {"cases": cases, "all_ok": all(c["ok"] for c in cases) and graphs_ok,
            "moe_decode": moe_decode, "copy_bandwidth_GBps": copy / 1e9,
            "seconds": time.perf_counter() - t0}

"""RMSNorm, fused add + RMSNorm, rotary (whole and partial), SiLU-and-mul, GELU(tanh)-and-mul
and the KV write vs the references."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference import reference
from officellm.kernels.triton import ops as tri
from tests.kernels.conftest import DTYPES, close


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])  # 96: a row that is not a power of two
def test_rms_norm_rows(device, dtype, hidden):
    x = torch.randn(7, hidden, dtype=dtype, device=device) * 3
    w = torch.randn(hidden, dtype=dtype, device=device)
    close(tri.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_heads(device, dtype):
    """q/k norms see a [T, H, D] view cut out of the fused qkv output."""
    qkv = torch.randn(5, 3 * 4 * 16, dtype=dtype, device=device)
    q = qkv[:, : 4 * 16].view(5, 4, 16)
    w = torch.randn(16, dtype=dtype, device=device)
    got = tri.rms_norm(q, w, 1e-5)
    assert got.shape == q.shape
    close(got, reference.rms_norm(q, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(device, dtype):
    x = torch.randn(9, 80, dtype=dtype, device=device)
    res = torch.randn(9, 80, dtype=dtype, device=device)
    w = torch.randn(80, dtype=dtype, device=device)
    x0, res0 = x.clone(), res.clone()
    out, new_res = tri.fused_add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_res = reference.fused_add_rms_norm(x, res, w, 1e-6)
    close(out, ref_out, dtype)
    torch.testing.assert_close(new_res, ref_res, atol=0, rtol=0)  # one rounding, same as torch
    assert torch.equal(x, x0) and torch.equal(res, res0), "inputs must not be modified"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("share", [1.0, 0.75], ids=["whole", "partial"])
def test_apply_rotary(device, dtype, head_dim, share):
    """share 0.75: Phi-4-mini's partial rotary, cos/sin [T, R]: pairs (i, i + R/2) of each
    head's first R values rotate, its last D - R are copied bit for bit."""
    t, hq, hk, r = 5, 4, 2, int(head_dim * share)
    qkv = torch.randn(t, (hq + 2 * hk) * head_dim, dtype=dtype, device=device)
    q = qkv[:, : hq * head_dim].view(t, hq, head_dim)  # strided views, as the model passes
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(t, hk, head_dim)
    # Distinct halves, so a kernel that reused one half's cos/sin for both would fail.
    cos = torch.randn(t, r, device=device)
    sin = torch.randn(t, r, device=device)
    q_out, k_out = tri.apply_rotary(q, k, cos, sin)
    q_ref, k_ref = reference.apply_rotary(q, k, cos, sin)
    close(q_out, q_ref, dtype)
    close(k_out, k_ref, dtype)
    assert torch.equal(q_out[..., r:], q[..., r:]) and torch.equal(k_out[..., r:], k[..., r:])


def test_rotary_refuses_cos_wider_than_the_head_or_odd(device):
    q = torch.randn(2, 2, 16, device=device)
    for width in (18, 7):
        cos = torch.randn(2, width, device=device)
        with pytest.raises(ValueError, match="even width of at most head_dim"):
            tri.apply_rotary(q, q, cos, cos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [48, 1100])  # 1100: spans two column blocks with a tail
def test_silu_and_mul(device, dtype, inter):
    x = torch.randn(3, 2 * inter, dtype=dtype, device=device) * 4
    close(tri.silu_and_mul(x), reference.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [48, 1100])
def test_gelu_tanh_and_mul(device, dtype, inter):
    """Gemma's GeGLU; gates up to about +-16 reach both tails of the tanh."""
    x = torch.randn(3, 2 * inter, dtype=dtype, device=device) * 4
    close(tri.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_cache_skips_padding_slots(device, dtype):
    blocks, bs, hk, d = 5, 4, 2, 16
    kc = torch.randn(blocks, bs, hk, d, dtype=dtype, device=device)
    vc = torch.randn(blocks, bs, hk, d, dtype=dtype, device=device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    kv = torch.randn(6, 2 * hk * d, dtype=dtype, device=device)  # strided k/v views
    k = kv[:, : hk * d].view(6, hk, d)
    v = kv[:, hk * d :].view(6, hk, d)
    slots = torch.tensor([3, 4, -1, 19, 0, -1], device=device)  # block boundary, last slot
    tri.write_kv_cache(k, v, kc, vc, slots)
    reference.write_kv_cache(k, v, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["e4m3", "e5m2"])
def test_write_kv_cache_into_an_fp8_cache_stores_the_reference_bytes(device, cache_dtype):
    """Rounded as torch rounds, saturated at the format's largest value (not NaN), padding
    slots skipped."""
    blocks, bs, hk, d = 5, 4, 2, 16
    kc = torch.zeros(blocks, bs, hk, d, dtype=cache_dtype, device=device)
    vc = torch.zeros_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    k = torch.randn(6, hk, d, device=device) * 30
    v = torch.randn(6, hk, d, device=device)
    k[0, 0, :2] = torch.tensor([1e6, -1e6])
    slots = torch.tensor([3, 4, -1, 19, 0, -1], device=device)
    tri.write_kv_cache(k, v, kc, vc, slots)
    reference.write_kv_cache(k, v, kc_ref, vc_ref, slots)
    assert torch.equal(kc.view(torch.uint8), kc_ref.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), vc_ref.view(torch.uint8))
    assert torch.isfinite(kc_ref.float()).all()



def test_write_kv_cache_into_an_int8_cache_stores_the_reference_rows(device):
    """Each (token, head) row: its values as int8 at 127 / amax, then amax / 127 as float32;
    an all-zero row stores zeros; padding slots skipped."""
    blocks, bs, hk, d = 5, 4, 2, 16
    kc = torch.zeros(blocks, bs, hk, d + 4, dtype=torch.int8, device=device)
    vc = torch.zeros_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    k = torch.randn(6, hk, d, device=device) * 30
    v = torch.randn(6, hk, d, device=device)
    k[1, 0] = 0
    slots = torch.tensor([3, 4, -1, 19, 0, -1], device=device)
    tri.write_kv_cache(k, v, kc, vc, slots)
    reference.write_kv_cache(k, v, kc_ref, vc_ref, slots)
    for ours, ref in ((kc, kc_ref), (vc, vc_ref)):
        # A GPU's division may round 127 / amax an ulp apart: at most one step off, rarely.
        steps = (ours[..., :d].int() - ref[..., :d].int()).abs()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01
        torch.testing.assert_close(ours[..., d:].contiguous().view(torch.float32),
                                   ref[..., d:].contiguous().view(torch.float32))
    assert kc_ref.view(-1, hk, d + 4)[4, 0].eq(0).all()  # the zero row, scale included


# Rows 2**30 elements apart, so the last row starts past 2**31: a kernel computing
# `row * stride` in 32 bits wraps there (as the MLP input of Qwen2.5-7B does at ~57k tokens in
# one step). The storage is allocated but never filled: only the rows in use get pages.
FAR = 2**30


def _far_rows(device, *tail: int, rows: int = 3) -> torch.Tensor:
    """A [rows, *tail] float16 view whose rows are FAR elements apart, filled at random."""
    inner = [1]
    for size in reversed(tail[1:]):
        inner.insert(0, inner[0] * size)
    base = torch.empty(FAR * (rows - 1) + int(torch.tensor(tail).prod()), dtype=torch.float16,
                       device=device)
    view = base.as_strided((rows, *tail), (FAR, *inner))
    view.copy_(torch.randn(rows, *tail, dtype=torch.float16, device=device))
    return view


def test_silu_and_mul_reads_rows_past_2_31_elements(device):
    x = _far_rows(device, 2 * 48)
    close(tri.silu_and_mul(x), reference.silu_and_mul(x.contiguous()), torch.float16)


def test_rms_norm_reads_rows_past_2_31_elements(device):
    x = _far_rows(device, 64)
    w = torch.randn(64, dtype=torch.float16, device=device)
    close(tri.rms_norm(x, w, 1e-6), reference.rms_norm(x.contiguous(), w, 1e-6), torch.float16)


def test_rotary_reads_tokens_past_2_31_elements(device):
    q = _far_rows(device, 4, 16)
    k = torch.randn(3, 2, 16, dtype=torch.float16, device=device)
    cos, sin = torch.randn(3, 16, device=device), torch.randn(3, 16, device=device)
    q_out, k_out = tri.apply_rotary(q, k, cos, sin)
    q_ref, k_ref = reference.apply_rotary(q.contiguous(), k, cos, sin)
    close(q_out, q_ref, torch.float16)
    close(k_out, k_ref, torch.float16)


def test_write_kv_cache_reads_tokens_past_2_31_elements(device):
    k = _far_rows(device, 2, 16)
    v = torch.randn(3, 2, 16, dtype=torch.float16, device=device)
    kc = torch.zeros(2, 4, 2, 16, dtype=torch.float16, device=device)
    vc = torch.zeros_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([1, 6, 3], device=device)
    tri.write_kv_cache(k, v, kc, vc, slots)
    reference.write_kv_cache(k.contiguous(), v, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)

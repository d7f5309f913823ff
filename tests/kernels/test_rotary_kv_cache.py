"""The fused rotary + KV-cache write stores what apply_rotary then write_kv_cache store, byte
for byte, and returns apply_rotary's q."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference import reference
from officellm.kernels.triton import ops as tri

BLOCKS, PAGE = 3, 4
# Query dtypes with the caches they meet: their own, a float32 model's 16-bit cache, fp8, int8.
CASES = [(q, c) for q in (torch.float32, torch.float16, torch.bfloat16)
         for c in (q, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)]
CASES.append((torch.float32, torch.bfloat16))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _qkv(t: int, hq: int, hk: int, d: int, dtype: torch.dtype, device):
    """Strided q/k/v views of one fused qkv tensor, as the model produces them."""
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=device).mul(4).to(dtype)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d)


def _caches(hk: int, d: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches holding random bytes (compared as bytes), so a store that is missing or
    misplaced shows."""
    width = reference.cache_row_width(d, dtype)
    shape = (BLOCKS, PAGE, hk, width * dtype.itemsize)
    raw = [torch.randint(0, 256, shape, dtype=torch.uint8, device=device) for _ in range(2)]
    return raw[0].view(dtype), raw[1].view(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _cos_sin(t: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Distinct halves, so a kernel that reused one half's cos/sin for both would fail.
    return torch.randn(t, d, device=device), torch.randn(t, d, device=device)


def _unfused(q, k, v, cos, sin, kc, vc, slots):
    q_ref, k_ref = tri.apply_rotary(q, k, cos, sin)
    tri.write_kv_cache(k_ref, v, kc, vc, slots)
    return q_ref


@pytest.mark.parametrize("q_dtype,cache_dtype", CASES,
                         ids=[f"q-{_name(q)}-cache-{_name(c)}" for q, c in CASES])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fused_caches_equal_rotary_then_write_bit_for_bit(device, q_dtype, cache_dtype,
                                                         head_dim):
    t, hq, hk = 5, 4, 2  # GQA: two query heads per KV head
    q, k, v = _qkv(t, hq, hk, head_dim, q_dtype, device)
    cos, sin = _cos_sin(t, head_dim, device)
    kc, vc = _caches(hk, head_dim, cache_dtype, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([3, 4, 11, 0, 7], device=device)  # a page boundary, the last slot
    tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, slots)
    _unfused(q, k, v, cos, sin, kc_ref, vc_ref, slots)
    assert torch.equal(_bytes(kc), _bytes(kc_ref))
    assert torch.equal(_bytes(vc), _bytes(vc_ref))


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float8_e5m2, torch.int8],
                         ids=_name)
def test_partial_rotary_caches_and_q_equal_rotary_then_write(device, cache_dtype):
    """Partial rotary (R = 3/4 D): the key's last D - R values are stored unrotated, and an
    int8 row's scale covers them too; q and both caches are apply_rotary then
    write_kv_cache's (apply_rotary's partial rotary is checked against the reference in
    test_elementwise.py)."""
    t, hq, hk, d, r = 5, 4, 2, 64, 48
    q, k, v = _qkv(t, hq, hk, d, torch.float16, device)
    cos, sin = _cos_sin(t, r, device)
    kc, vc = _caches(hk, d, cache_dtype, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([3, 4, 11, 0, 7], device=device)
    got_q = tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, slots)
    want_q = _unfused(q, k, v, cos, sin, kc_ref, vc_ref, slots)
    assert torch.equal(got_q, want_q)
    assert torch.equal(_bytes(kc), _bytes(kc_ref)) and torch.equal(_bytes(vc), _bytes(vc_ref))
    if cache_dtype == torch.float16:  # the unrotated values, stored as they are
        assert torch.equal(kc.view(-1, hk, d)[slots][..., r:], k[..., r:])


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=_name)
def test_fused_returns_the_rotated_q_of_apply_rotary(device, q_dtype):
    t, hq, hk, d = 3, 3, 1, 64
    q, k, v = _qkv(t, hq, hk, d, q_dtype, device)
    cos, sin = _cos_sin(t, d, device)
    kc, vc = _caches(hk, d, torch.int8, device)
    got = tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, torch.arange(t, device=device))
    want, _ = tri.apply_rotary(q, k, cos, sin)
    assert got.shape == (t, hq, d) and got.is_contiguous()
    assert torch.equal(_bytes(got), _bytes(want))


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float8_e5m2, torch.int8],
                         ids=_name)
def test_padding_slots_leave_the_cache_untouched(device, cache_dtype):
    t, hq, hk, d = 4, 2, 2, 64
    q, k, v = _qkv(t, hq, hk, d, torch.float16, device)
    cos, sin = _cos_sin(t, d, device)
    kc, vc = _caches(hk, d, cache_dtype, device)
    kc0, vc0 = kc.clone(), vc.clone()
    tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, torch.full((t,), -1, device=device))
    assert torch.equal(_bytes(kc), _bytes(kc0)) and torch.equal(_bytes(vc), _bytes(vc0))


def test_padding_slots_between_stored_tokens_are_skipped(device):
    t, hq, hk, d = 4, 2, 1, 64
    q, k, v = _qkv(t, hq, hk, d, torch.float16, device)
    cos, sin = _cos_sin(t, d, device)
    kc, vc = _caches(hk, d, torch.float16, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([2, -1, 9, -1], device=device)
    tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, slots)
    _unfused(q, k, v, cos, sin, kc_ref, vc_ref, slots)
    assert torch.equal(_bytes(kc), _bytes(kc_ref)) and torch.equal(_bytes(vc), _bytes(vc_ref))


def test_fused_reads_tokens_past_2_31_elements(device):
    """Token rows 2**30 elements apart (the storage is allocated, never filled): a kernel
    computing `tok * stride` in 32 bits wraps on the last."""
    far, t, hk, d = 2**30, 3, 2, 16
    base = torch.empty(far * (t - 1) + hk * d, dtype=torch.float16, device=device)
    k = base.as_strided((t, hk, d), (far, d, 1))
    k.copy_(torch.randn(t, hk, d, dtype=torch.float16, device=device))
    q = torch.randn(t, 2, d, dtype=torch.float16, device=device)
    v = torch.randn(t, hk, d, dtype=torch.float16, device=device)
    cos, sin = _cos_sin(t, d, device)
    kc = torch.zeros(2, PAGE, hk, d, dtype=torch.float16, device=device)
    vc = torch.zeros_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([1, 6, 3], device=device)
    tri.rotary_write_kv(q, k, v, cos, sin, kc, vc, slots)
    _, k_rot = reference.apply_rotary(q, k.contiguous(), cos, sin)
    reference.write_kv_cache(k_rot, v, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)

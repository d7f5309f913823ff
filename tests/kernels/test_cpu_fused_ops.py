"""The C++ fused per-layer ops (kernels/cpu/fused_ops.cpp) vs kernels/reference/reference.py."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.ops import kernel_ops
from officellm.kernels.reference import reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def ops(cpu_kernels_module):
    return kernel_ops("cpu")


def _rand(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(ops, dtype):
    x, w = _rand(7, 576, dtype=dtype), _rand(576, dtype=dtype, seed=1)
    # Only the float32 sum of squares is taken in another order: at most one rounding step.
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_per_head_views_of_a_fused_qkv_matches_reference(ops, dtype):
    """Qwen3's q/k norms: [T, heads, D] views into the qkv output (row stride = the fused
    width), normed per head by the kernel, not the reference."""
    qkv, w = _rand(3, (4 + 2 * 2) * 64, dtype=dtype), _rand(64, dtype=dtype, seed=1)
    q = qkv[:, :256].view(3, 4, 64)
    k = qkv[:, 256:384].view(3, 2, 64)
    assert not q.is_contiguous() and not k.is_contiguous()
    module = cpu_kernels.load()
    for view in (q, k):
        out = module.rms_norm(view, w, 1e-6)
        assert out.shape == view.shape and out.is_contiguous()
        torch.testing.assert_close(out, reference.rms_norm(view, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_matches_reference(ops, dtype):
    x, r = (_rand(5, 320, dtype=dtype, seed=s) for s in range(2))
    w = _rand(320, dtype=dtype, seed=2)
    out, residual = ops.fused_add_rms_norm(x, r, w, 1e-6)
    ref_out, ref_residual = reference.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(residual, ref_residual)
    torch.testing.assert_close(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("share", [1.0, 0.75], ids=["whole", "partial"])
def test_rotary_is_bit_identical_to_reference(ops, dtype, share):
    """q and k are strided views of one fused qkv output, as in the model. share 0.75:
    Phi-4-mini's partial rotary (cos/sin [T, R]), which the compiled kernel runs too."""
    t, hq, hk, d = 6, 9, 3, 64
    r = int(d * share)
    qkv = _rand(t, (hq + 2 * hk) * d, dtype=dtype)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hk, d)
    angles = _rand(t, r // 2, dtype=torch.float32, seed=4)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    ref_q, ref_k = reference.apply_rotary(q, k, cos, sin)
    for got_q, got_k in (ops.apply_rotary(q, k, cos, sin),
                         cpu_kernels.load().apply_rotary(q, k, cos, sin)):
        assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


def test_rotary_refuses_cos_wider_than_the_head(ops):
    q = _rand(2, 2, 16, dtype=torch.float32)
    cos = _rand(2, 18, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="at most the head size"):
        cpu_kernels.load().apply_rotary(q, q, cos, cos)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(ops, dtype):
    x = _rand(4, 2 * 1536, dtype=dtype) * 4
    got, ref = ops.silu_and_mul(x), reference.silu_and_mul(x)
    # exp is vectorized differently from torch's: equal up to one rounding of the dtype.
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_and_mul_matches_reference(ops, dtype):
    """Gemma's GeGLU: gates up to about +-16 reach both tails of the tanh."""
    x = _rand(4, 2 * 1536, dtype=dtype) * 4
    got = cpu_kernels.load().gelu_tanh_and_mul(x)
    # tanh is vectorized differently from torch's: equal up to one rounding of the dtype.
    torch.testing.assert_close(got, reference.gelu_tanh_and_mul(x))
    torch.testing.assert_close(ops.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x))


def test_gated_activations_of_uneven_rows_fall_back_to_the_reference(ops):
    x = _rand(8, 3, dtype=torch.float32).t()  # inner stride 3
    assert torch.equal(ops.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x))
    assert torch.equal(ops.silu_and_mul(x), reference.silu_and_mul(x))

"""The C++ KV cache write (kernels/cpu/kv_cache_write.cpp) stores the reference's bits."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference import reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def module(cpu_kernels_module):
    return cpu_kernels_module


def _step(dtype: torch.dtype, tokens: int = 5, heads: int = 2, dim: int = 64):
    """k rotated (contiguous) and v a view into a fused qkv output, as a layer gives them."""
    g = torch.Generator().manual_seed(0)
    qkv = (torch.randn(tokens, (4 + 2 * heads) * dim, generator=g) * 3).to(dtype)
    k = qkv[:, 4 * dim:(4 + heads) * dim].contiguous().view(tokens, heads, dim)
    v = qkv[:, (4 + heads) * dim:].view(tokens, heads, dim)
    return k, v


@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_compiled_write_stores_the_references_bits(module, dtype, cache_dtype):
    k, v = _step(dtype)
    assert not v.is_contiguous()
    slots = torch.tensor([17, 3, -1, 40, 0])  # -1: a token whose KV is not stored
    caches = [torch.full((4, 16, 2, 64), 7.0, dtype=cache_dtype) for _ in range(4)]
    module.write_kv_cache(k, v, caches[0], caches[1], slots)
    reference.write_kv_cache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_a_quantized_cache_is_refused_saying_which_caches_it_writes(module):
    k, v = _step(torch.float32)
    cache = torch.zeros(4, 16, 2, 68, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="float32, bf16 or fp16 cache"):
        module.write_kv_cache(k, v, cache, cache, torch.arange(5))

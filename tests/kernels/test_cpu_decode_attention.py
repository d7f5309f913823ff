"""The C++ CPU paged decode attention (kernels/cpu/decode_attention.cpp) vs the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.reference.paged_problems import make_problem, reference_output, stored_as
from officellm.kernels.reference.reference import to_cache_dtype
from tests.kernels.conftest import close, cpu_build_levels

# Odd lengths, exact block boundaries (16, 32), one token, one past a boundary, a long one.
DECODE_LENS = [17, 1, 32, 45, 300]


@pytest.fixture(scope="module")
def kernel(cpu_kernels_module):
    return cpu_kernels_module


LEVELS = cpu_build_levels()
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _ in LEVELS])
def kernel_at_level(request):
    """The kernels built for each level this CPU runs: the fp8 rows are converted 8 at a
    time with F16C on the AVX2 and AVX-512 builds, one by one on the portable one."""
    module = cpu_kernels.load(request.param[1])
    if module is None:
        pytest.fail("the CPU attention kernel did not build (is a C++ compiler installed?)")
    return module


def _run(kernel, p):
    return kernel.paged_decode_attention(p.q, p.k_cache, p.v_cache, p.block_tables.long(),
                                         p.seq_lens.long(), p.scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hk", [(2, 2), (9, 3), (8, 1)])  # GQA ratios 1, 3 (SmolLM2), 8
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_matches_reference(kernel, dtype, hq, hk, head_dim):
    p = make_problem([(n, 1) for n in DECODE_LENS], hq, hk, head_dim, dtype, torch.device("cpu"))
    close(_run(kernel, p), reference_output(p), dtype)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hk,head_dim", [(9, 3, 64), (8, 1, 128), (5, 5, 128), (10, 2, 64),
                                            (4, 2, 32)])
def test_decode_of_a_float32_query_reads_a_16_bit_cache(kernel_at_level, cache_dtype, hq, hk,
                                                        head_dim):
    """--kv-cache-dtype auto under a float32 model on the CPU: the kernel converts the stored
    keys and values on load and computes in float32, so it equals the reference on the same
    rounded cache. On the AVX2 and AVX-512 builds head sizes 64 and 128 with 1 to 8 query
    heads per KV head take the register-resident AVX2 kernel (groups of 3, 8, 1 and 5 heads:
    p.v in chunks of 4, 1, 8 and 2 vectors); size 32 and the portable build take the generic
    kernel. Lengths past a block also run the next block's prefetch."""
    p = make_problem([(n, 1) for n in DECODE_LENS], hq, hk, head_dim, torch.float32,
                     torch.device("cpu"))
    stored = dataclasses.replace(p, k_cache=p.k_cache.to(cache_dtype),
                                 v_cache=p.v_cache.to(cache_dtype))
    rounded = dataclasses.replace(p, k_cache=stored.k_cache.float(),
                                  v_cache=stored.v_cache.float())
    out = _run(kernel_at_level, stored)
    assert out.dtype == torch.float32
    close(out, reference_output(rounded), torch.float32)


@pytest.mark.parametrize("cache_dtype", [*FP8, torch.int8], ids=["e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk,head_dim", [(9, 3, 64), (8, 1, 128), (4, 2, 36)])
def test_decode_reads_a_one_byte_cache_under_any_query_dtype(kernel_at_level, cache_dtype,
                                                             q_dtype, hq, hk, head_dim):
    """--kv-cache-dtype fp8_*/int8: the kernel converts each stored byte on load (int8: times
    its row's scale), so it equals the reference on the values the cache holds (36: rows
    that end in the one-by-one tail)."""
    p = make_problem([(n, 1) for n in DECODE_LENS], hq, hk, head_dim, q_dtype,
                     torch.device("cpu"))
    stored, rounded = stored_as(p, cache_dtype)
    out = _run(kernel_at_level, stored)
    assert out.dtype == q_dtype
    close(out, reference_output(rounded), q_dtype)


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
def test_every_fp8_code_is_read_exactly(kernel_at_level, cache_dtype):
    """A one-token sequence's output is its value row: with the 256 byte codes as that row
    (NaN and infinity, never written, left out), the kernel must return torch's conversion
    of each."""
    raw = torch.arange(256, dtype=torch.uint8)
    raw[~raw.view(cache_dtype).float().isfinite()] = 0
    codes = raw.view(cache_dtype)
    v_cache = torch.zeros(2, 16, 1, 256, dtype=cache_dtype)
    v_cache[0, 0, 0] = codes
    k_cache = torch.zeros_like(v_cache)
    q = torch.ones(1, 1, 256)
    out = kernel_at_level.paged_decode_attention(q, k_cache, v_cache, torch.tensor([[0]]),
                                                 torch.tensor([1]), 1.0)
    assert torch.equal(out[0, 0], codes.float())


def test_an_fp8_store_saturates_instead_of_making_nan():
    x = torch.tensor([1e6, -1e6, 3.0])
    assert to_cache_dtype(x, torch.float8_e4m3fn).float().tolist() == [448.0, -448.0, 3.0]
    assert to_cache_dtype(x, torch.float8_e5m2).float().tolist() == [57344.0, -57344.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [[2000], [1500, 3, 17, 40]], ids=["alone", "with-short-ones"])
def test_a_long_context_cut_into_parts_matches_reference(kernel_at_level, dtype, lens):
    """A long sequence's context is attended in parts (one user alone still uses every
    thread) that are merged by their softmax maxima and sums: the merge must give the
    reference's output, beside short sequences too."""
    p = make_problem([(n, 1) for n in lens], 9, 3, 64, dtype, torch.device("cpu"), seed=3)
    close(_run(kernel_at_level, p), reference_output(p), dtype)


def test_decode_reads_only_its_blocks(kernel):
    """Blocks are shuffled and unused slots hold large values: any stray read shows."""
    p = make_problem([(70, 1), (9, 1)], 4, 2, 32, torch.float32, torch.device("cpu"),
                     block_size=8, seed=5)
    close(_run(kernel, p), reference_output(p), torch.float32)


def test_decode_with_huge_scores_stays_finite(kernel):
    """The online softmax subtracts the running max: scores of ~1e4 must not overflow exp."""
    p = make_problem([(40, 1), (3, 1)], 4, 2, 32, torch.float32, torch.device("cpu"), seed=7)
    p.q.mul_(300.0)
    out = _run(kernel, p)
    assert torch.isfinite(out).all()
    close(out, reference_output(p), torch.float32)


def test_decode_refuses_an_int8_cache_without_room_for_its_scales(kernel):
    p = make_problem([(5, 1)], 2, 2, 16, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="int8 cache's rows are head_dim . 4 bytes"):
        kernel.paged_decode_attention(p.q, p.k_cache.to(torch.int8), p.v_cache.to(torch.int8),
                                      p.block_tables.long(), p.seq_lens.long(), p.scale)


def test_decode_rejects_mismatched_dtypes(kernel):
    p = make_problem([(5, 1)], 2, 2, 16, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="share a dtype"):  # a 16-bit query, float32 cache
        kernel.paged_decode_attention(p.q.bfloat16(), p.k_cache, p.v_cache,
                                      p.block_tables.long(), p.seq_lens.long(), p.scale)
    with pytest.raises(RuntimeError, match="K and V caches must share"):
        kernel.paged_decode_attention(p.q, p.k_cache.half(), p.v_cache.bfloat16(),
                                      p.block_tables.long(), p.seq_lens.long(), p.scale)

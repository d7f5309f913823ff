"""The C++ CPU chunk attention (kernels/cpu/chunk_attention.cpp: paged_chunk_attention): a
prompt chunk's rows over their sequence's paged cache, each row causal, vs the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.reference.paged_problems import make_problem, reference_output, stored_as
from tests.kernels.conftest import close, cpu_build_levels

# (context length, chunk rows): one row; a chunk inside one block; chunks that start and end
# mid-block or on a boundary; the whole sequence as its own chunk; a long history cut into
# parts (several per thread) under a chunk that spans three blocks.
CHUNKS = [(17, 1), (45, 7), (32, 16), (33, 33), (300, 24), (1500, 40)]
LEVELS = cpu_build_levels()


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _ in LEVELS])
def kernel_at_level(request):
    """The kernels of each build level this CPU runs: the AVX2 and AVX-512 builds run the
    chunk kernel, the portable one runs each row through the decode kernel."""
    module = cpu_kernels.load(request.param[1])
    if module is None:
        pytest.fail("the CPU attention kernel did not build (is a C++ compiler installed?)")
    return module


def _run(kernel, p):
    return kernel.paged_chunk_attention(p.q, p.k_cache, p.v_cache, p.block_tables[0].long(),
                                        int(p.seq_lens[0]), p.scale)


@pytest.mark.parametrize("ctx,rows", CHUNKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk,head_dim", [(9, 3, 64), (8, 1, 128), (5, 5, 128), (6, 2, 64)])
def test_chunk_matches_reference(kernel_at_level, ctx, rows, dtype, hq, hk, head_dim):
    """Row r of the chunk sees the first ctx - rows + 1 + r keys: a kernel that let a row see
    a later row's key, or missed its own, would differ (odd head counts per KV head also run
    the kernel's one-head tiles)."""
    p = make_problem([(ctx, rows)], hq, hk, head_dim, dtype, torch.device("cpu"))
    out = _run(kernel_at_level, p)
    assert out.dtype == dtype
    close(out, reference_output(p), dtype)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_chunk_of_a_float32_query_reads_a_16_bit_cache(kernel_at_level, cache_dtype):
    """--kv-cache-dtype auto under a float32 model: keys and values converted on load."""
    p = make_problem([(300, 24)], 9, 3, 64, torch.float32, torch.device("cpu"))
    stored = dataclasses.replace(p, k_cache=p.k_cache.to(cache_dtype),
                                 v_cache=p.v_cache.to(cache_dtype))
    rounded = dataclasses.replace(p, k_cache=stored.k_cache.float(),
                                  v_cache=stored.v_cache.float())
    close(_run(kernel_at_level, stored), reference_output(rounded), torch.float32)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8],
                         ids=["e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_chunk_reads_a_one_byte_cache(kernel_at_level, cache_dtype, q_dtype):
    p = make_problem([(100, 20)], 9, 3, 64, q_dtype, torch.device("cpu"))
    stored, rounded = stored_as(p, cache_dtype)
    close(_run(kernel_at_level, stored), reference_output(rounded), q_dtype)


@pytest.mark.parametrize("head_dim", [32, 36])
def test_a_head_size_without_a_chunk_kernel_goes_row_by_row(kernel_at_level, head_dim):
    """Sizes other than 64 and 128 take each row through the decode kernel: same result."""
    p = make_problem([(70, 12)], 4, 2, head_dim, torch.float32, torch.device("cpu"))
    close(_run(kernel_at_level, p), reference_output(p), torch.float32)


def test_a_chunk_longer_than_its_sequence_is_refused(kernel_at_level):
    p = make_problem([(20, 20)], 9, 3, 64, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="1 to seq_len rows"):
        kernel_at_level.paged_chunk_attention(p.q, p.k_cache, p.v_cache,
                                              p.block_tables[0].long(), 10, p.scale)


def test_a_block_table_too_short_for_the_sequence_is_refused(kernel_at_level):
    p = make_problem([(40, 8)], 9, 3, 64, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="too short"):
        kernel_at_level.paged_chunk_attention(p.q, p.k_cache, p.v_cache,
                                              p.block_tables[0, :2].long(), 40, p.scale)


def test_a_cache_the_query_cannot_read_is_refused(kernel_at_level):
    """A bfloat16 query over a float16 cache is not one of the readable pairs."""
    p = make_problem([(40, 8)], 9, 3, 64, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="must share a dtype"):
        kernel_at_level.paged_chunk_attention(p.q, p.k_cache.half(), p.v_cache.half(),
                                              p.block_tables[0].long(), 40, p.scale)

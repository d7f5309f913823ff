"""The C++ CPU attention kernels (kernels/cpu/decode_attention.cpp, chunk_attention.cpp) with a
sliding window (Gemma 3, gpt-oss) and attention sinks (gpt-oss) vs the reference.

The blocks wholly before a sequence's window are the null block filled with NaN bytes (NaN in
every cache dtype, an int8 row's scale included): one read of them, even of a key whose
weight is 0, would turn the output NaN, so agreeing with the reference proves they are
never read."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.reference.paged_problems import (
    hidden_by_window,
    make_problem,
    reference_output,
    stored_as,
)
from tests.kernels.conftest import close, cpu_build_levels

CPU = torch.device("cpu")
LEVELS = cpu_build_levels()
# One token, block boundaries, and a context cut into several parts (8 blocks each).
DECODE_LENS = [17, 1, 32, 45, 300, 700]
# Windows shorter than every context but one, equal to one (45), longer than all but the
# longest two, and longer than every context.
WINDOWS = [1, 7, 16, 45, 300, 5000]
# (query heads, KV heads, head size): SmolLM2's; one KV head of 8 (the AVX2 and AVX-512 bf16
# kernels' widest group); gpt-oss's 64 / 8 / 64 in small; Gemma 3's 256 wide heads (the
# generic kernel).
LAYOUTS = [(9, 3, 64), (8, 1, 128), (8, 1, 64), (2, 1, 256)]
# (query dtype, cache dtype): each decode kernel: the generic float32 one, the AVX-512 bf16
# one, the AVX2 float32-over-16-bit one.
PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
         (torch.float32, torch.bfloat16)]


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _ in LEVELS])
def kernel(request):
    """The kernels of each build level this CPU runs (the portable one has neither the AVX2
    kernels nor the chunk kernel: its chunks go row by row through the decode kernel)."""
    module = cpu_kernels.load(request.param[1])
    if module is None:
        pytest.fail("the CPU attention kernel did not build (is a C++ compiler installed?)")
    return module


def _sinks(hq: int, seed: int = 11) -> torch.Tensor:
    # Logits of the scores' own size, so the sink takes a real share of each row.
    return torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * 2


def _decode(kernel, p, window: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    return kernel.paged_decode_attention(p.q, p.k_cache, p.v_cache, p.block_tables.long(),
                                         p.seq_lens.long(), p.scale, window, sinks)


def _chunk(kernel, p, window: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    return kernel.paged_chunk_attention(p.q, p.k_cache, p.v_cache, p.block_tables[0].long(),
                                        int(p.seq_lens[0]), p.scale, window, sinks)


def _cached(p, q_dtype: torch.dtype, cache_dtype: torch.dtype):
    """(the problem with its caches in cache_dtype, the same over the values they hold)."""
    if cache_dtype == q_dtype:
        return p, p
    if cache_dtype.itemsize == 1:
        return stored_as(p, cache_dtype)
    stored = dataclasses.replace(p, k_cache=p.k_cache.to(cache_dtype),
                                 v_cache=p.v_cache.to(cache_dtype))
    return stored, dataclasses.replace(p, k_cache=stored.k_cache.to(q_dtype),
                                       v_cache=stored.v_cache.to(q_dtype))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("q_dtype,cache_dtype", PAIRS, ids=["f32", "bf16", "f32-over-bf16"])
def test_decode_sees_its_last_window_keys_and_never_reads_the_blocks_before(
        kernel, window, q_dtype, cache_dtype):
    p = make_problem([(n, 1) for n in DECODE_LENS], 9, 3, 64, q_dtype, CPU)
    stored, rounded = _cached(p, q_dtype, cache_dtype)
    out = _decode(kernel, hidden_by_window(stored, window), window)
    close(out, reference_output(rounded, window), q_dtype)


@pytest.mark.parametrize("hq,hk,head_dim", LAYOUTS)
@pytest.mark.parametrize("q_dtype,cache_dtype", PAIRS, ids=["f32", "bf16", "f32-over-bf16"])
def test_decode_with_a_window_and_sinks_matches_reference_for_every_layout(
        kernel, hq, hk, head_dim, q_dtype, cache_dtype):
    p = make_problem([(n, 1) for n in DECODE_LENS], hq, hk, head_dim, q_dtype, CPU, seed=1)
    stored, rounded = _cached(p, q_dtype, cache_dtype)
    sinks = _sinks(hq)
    out = _decode(kernel, hidden_by_window(stored, 40), 40, sinks)
    close(out, reference_output(rounded, 40, sinks), q_dtype)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_sinks_join_each_rows_softmax_once_across_a_long_contexts_parts(kernel, q_dtype):
    """A 2,000-token context is attended in 16 parts merged at the end: the sink must enter
    the merged max and sum exactly once (once per part would shrink the output)."""
    p = make_problem([(2000, 1), (3, 1), (0, 1)], 8, 1, 64, q_dtype, CPU, seed=2)
    sinks = _sinks(8)
    close(_decode(kernel, p, 0, sinks), reference_output(p, None, sinks), q_dtype)


def test_an_empty_sequence_with_sinks_gives_zeros(kernel):
    """A CUDA-graph padding row: no key, so all weight is the sink's and the output is 0."""
    p = make_problem([(0, 1)], 4, 2, 64, torch.float32, CPU)
    out = _decode(kernel, p, 16, _sinks(4))
    assert torch.equal(out, torch.zeros_like(out))


def test_a_sink_far_above_the_scores_takes_almost_all_the_weight(kernel):
    p = make_problem([(50, 1)], 4, 2, 64, torch.float32, CPU, seed=3)
    sinks = torch.full((4,), 60.0)
    out = _decode(kernel, p, 0, sinks)
    assert out.abs().max() < 1e-10
    close(out, reference_output(p, None, sinks), torch.float32)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8],
                         ids=["e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_decode_with_a_window_and_sinks_reads_a_one_byte_cache(kernel, cache_dtype, q_dtype):
    p = make_problem([(n, 1) for n in DECODE_LENS], 8, 1, 64, q_dtype, CPU, seed=4)
    stored, rounded = stored_as(p, cache_dtype)
    sinks = _sinks(8)
    out = _decode(kernel, hidden_by_window(stored, 100), 100, sinks)
    close(out, reference_output(rounded, 100, sinks), q_dtype)


# (context, chunk rows, window): the first row's window starting mid-block in its own block
# (45, 7, 5) or in an earlier one (300, 24, 40: block 14, the chunk's rows are in blocks
# 17-18); a window narrower than the chunk (33, 33, 8: later rows hide keys the first row
# sees); a long history whose window spans several parts (1500, 40, 300); a window as long
# as the context (45, 7, 45) and longer (17, 1, 64).
CHUNKS = [(45, 7, 5), (300, 24, 40), (300, 24, 20), (33, 33, 8), (1500, 40, 300), (45, 7, 45),
          (17, 1, 64)]


@pytest.mark.parametrize("ctx,rows,window", CHUNKS)
@pytest.mark.parametrize("hq,hk,head_dim", [(9, 3, 64), (8, 1, 128), (4, 2, 36)])
def test_chunk_rows_see_their_own_windows_and_never_read_the_blocks_before(
        kernel, ctx, rows, window, hq, hk, head_dim):
    """Head sizes 64 and 128 take the chunk kernel (on AVX2 and up), 36 goes row by row
    through the decode kernel."""
    p = make_problem([(ctx, rows)], hq, hk, head_dim, torch.float32, CPU, seed=6)
    out = _chunk(kernel, hidden_by_window(p, window), window)
    close(out, reference_output(p, window), torch.float32)


@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_chunk_with_sinks_matches_reference(kernel, window, q_dtype):
    p = make_problem([(300, 24)], 8, 1, 64, q_dtype, CPU, seed=7)
    sinks = _sinks(8)
    out = _chunk(kernel, hidden_by_window(p, window) if window else p, window, sinks)
    close(out, reference_output(p, window or None, sinks), q_dtype)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.int8],
                         ids=["bf16", "e4m3", "int8"])
def test_chunk_with_a_window_and_sinks_reads_a_converted_cache(kernel, cache_dtype):
    p = make_problem([(300, 24)], 9, 3, 64, torch.float32, CPU, seed=8)
    stored, rounded = _cached(p, torch.float32, cache_dtype)
    sinks = _sinks(9)
    out = _chunk(kernel, hidden_by_window(stored, 40), 40, sinks)
    close(out, reference_output(rounded, 40, sinks), torch.float32)


def test_a_negative_window_or_sinks_of_the_wrong_size_are_refused(kernel):
    decode = make_problem([(20, 1)], 4, 2, 64, torch.float32, CPU)
    chunk = make_problem([(20, 4)], 4, 2, 64, torch.float32, CPU)
    with pytest.raises(RuntimeError, match="window must be"):
        _decode(kernel, decode, -1)
    with pytest.raises(RuntimeError, match="window must be"):
        _chunk(kernel, chunk, -1)
    with pytest.raises(RuntimeError, match="one CPU logit per query head"):
        _decode(kernel, decode, 0, torch.zeros(2))

"""The Triton paged attention kernels (decode split-K, varlen prefill) with a sliding window
(Gemma 3, gpt-oss) and attention sinks (gpt-oss) vs the reference.

The blocks wholly before a sequence's window are the null block filled with NaN bytes: a
kernel that read them, even for a key it then gave weight 0, would return NaN, so agreeing
with the reference proves the split-K decode skips them and the prefill starts past them."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference.paged_problems import (
    hidden_by_window,
    make_problem,
    reference_output,
    stored_as,
)
from officellm.kernels.triton.decode_attention import paged_decode_attention
from officellm.kernels.triton.prefill_attention import paged_prefill_attention
from tests.kernels.conftest import DTYPES, close

# One token, a block boundary (32), and a context of several 64-key tiles.
DECODE_LENS = [17, 1, 32, 45, 140]
# A fresh prefill, a chunk after a cached prefix ending mid-block, a chunk starting on a
# block boundary, a decode, and a long chunk of several query tiles.
MIXED = [(21, 21), (37, 11), (48, 16), (30, 1), (100, 40)]


def _sinks(hq: int, device) -> torch.Tensor:
    return (torch.randn(hq, generator=torch.Generator().manual_seed(11)) * 2).to(device)


def _decode(p, window: int, sinks=None, splits: int = 4, block_n: int = 64) -> torch.Tensor:
    return paged_decode_attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                                  p.scale, num_splits=splits, block_n=block_n, window=window,
                                  sinks=sinks)


def _prefill(p, window: int, sinks=None, block_n: int = 16) -> torch.Tensor:
    return paged_prefill_attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                                   p.query_start_loc, p.scale, max_query_len=p.max_query_len,
                                   block_n=block_n, window=window, sinks=sinks)


# (window, splits, keys per tile): windows shorter than every context but one, equal to one
# (45), longer than all; one split and several; tiles of one block and of four (the first
# tile's blocks before the window then masked, not loaded).
DECODE_CASES = [(1, 4, 16), (7, 1, 64), (16, 4, 64), (45, 4, 16), (500, 1, 16), (500, 4, 64)]


@pytest.mark.parametrize("window,splits,block_n", DECODE_CASES)
def test_decode_sees_its_last_window_keys_and_never_reads_the_blocks_before(
        device, window, splits, block_n):
    p = make_problem([(n, 1) for n in DECODE_LENS], 4, 2, 32, torch.float32, device)
    out = _decode(hidden_by_window(p, window), window, splits=splits, block_n=block_n)
    close(out, reference_output(p, window), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_sinks_join_each_rows_softmax_once_across_splits(device, dtype, splits):
    p = make_problem([(n, 1) for n in DECODE_LENS], 8, 1, 32, dtype, device, seed=1)
    sinks = _sinks(8, device)
    close(_decode(p, 0, sinks, splits), reference_output(p, None, sinks), dtype)
    close(_decode(hidden_by_window(p, 40), 40, sinks, splits),
          reference_output(p, 40, sinks), dtype)


def test_an_empty_sequence_with_sinks_gives_zeros(device):
    """A CUDA-graph padding row (seq_len 0): all weight is the sink's, the output 0."""
    p = make_problem([(20, 1), (5, 1)], 4, 2, 16, torch.float32, device)
    p.seq_lens[1] = 0
    for splits in (1, 4):
        out = _decode(p, 8, _sinks(4, device), splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8],
                         ids=["e4m3", "e5m2", "int8"])
def test_decode_with_a_window_and_sinks_over_a_one_byte_cache(device, cache_dtype):
    p = make_problem([(n, 1) for n in DECODE_LENS], 4, 2, 32, torch.float32, device, seed=2)
    stored, rounded = stored_as(p, cache_dtype)
    sinks = _sinks(4, device)
    close(_decode(hidden_by_window(stored, 40), 40, sinks), reference_output(rounded, 40, sinks),
          torch.float32)


def test_prefill_with_a_window_and_sinks_over_an_int8_cache(device):
    p = make_problem(MIXED, 4, 2, 32, torch.float32, device, seed=3)
    stored, rounded = stored_as(p, torch.int8)
    sinks = _sinks(4, device)
    close(_prefill(hidden_by_window(stored, 20), 20, sinks), reference_output(rounded, 20, sinks),
          torch.float32)


@pytest.mark.parametrize("window,block_n", [(1, 16), (5, 64), (16, 16), (40, 64), (500, 16)])
def test_prefill_rows_see_their_own_windows_and_never_read_the_blocks_before(
        device, window, block_n):
    """A tile's query rows start their windows at different keys (a row may see nothing of
    the first key tile); tiles of one block and of four."""
    p = make_problem(MIXED, 4, 2, 32, torch.float32, device, seed=4)
    out = _prefill(hidden_by_window(p, window), window, block_n=block_n)
    close(out, reference_output(p, window), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 20])
def test_prefill_with_sinks_matches_reference(device, dtype, window):
    """gpt-oss's group of 8 query heads per KV head."""
    p = make_problem(MIXED, 8, 1, 32, dtype, device, seed=5)
    sinks = _sinks(8, device)
    hidden = hidden_by_window(p, window) if window else p
    close(_prefill(hidden, window, sinks), reference_output(p, window or None, sinks), dtype)


def test_a_negative_window_or_sinks_of_the_wrong_kind_are_refused(device):
    p = make_problem([(20, 1)], 4, 2, 16, torch.float32, device)
    with pytest.raises(ValueError, match="window must be"):
        _decode(p, -1)
    with pytest.raises(ValueError, match="sinks must be float32"):
        _decode(p, 0, torch.zeros(4, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="sinks must be float32"):
        _prefill(p, 0, torch.zeros(2, device=device))

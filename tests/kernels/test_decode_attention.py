"""Paged decode attention (split-K + merge) vs the reference."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference.paged_problems import make_problem, reference_output
from officellm.kernels.triton.decode_attention import default_num_splits, paged_decode_attention
from tests.kernels.conftest import DTYPES, close

# Odd lengths, exact block boundaries (16, 32), one token, and one past a boundary.
DECODE_LENS = [17, 1, 32, 45]


def _run(p, num_splits, block_n=16):
    return paged_decode_attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                                  p.scale, num_splits=num_splits, block_n=block_n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk", [(2, 2), (4, 1), (8, 1)])  # GQA ratios 1, 4, 8
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_matches_reference(device, dtype, hq, hk, head_dim):
    p = make_problem([(n, 1) for n in DECODE_LENS], hq, hk, head_dim, dtype, device)
    ref = reference_output(p)
    close(_run(p, num_splits=4), ref, dtype)


@pytest.mark.parametrize("splits", [1, 2, 8])
def test_decode_split_counts_agree(device, splits):
    """More splits than tiles (empty splits) and a single split give the same answer."""
    p = make_problem([(n, 1) for n in DECODE_LENS], 4, 2, 32, torch.float32, device, seed=3)
    close(_run(p, num_splits=splits), reference_output(p), torch.float32)


def test_decode_block_n_spanning_pages(device):
    """A key tile wider than a cache block gathers several shuffled pages per iteration."""
    p = make_problem([(70, 1), (9, 1)], 4, 2, 32, torch.float32, device, block_size=8, seed=5)
    close(_run(p, num_splits=2, block_n=32), reference_output(p), torch.float32)


def test_zero_length_rows_give_zeros(device):
    """CUDA-graph padding rows carry seq_len 0; they must come out 0, never NaN."""
    p = make_problem([(20, 1), (5, 1)], 4, 2, 16, torch.float32, device)
    p.seq_lens[1] = 0
    p.block_tables[1] = p.k_cache.shape[0] - 1
    for splits in (1, 4):
        out = _run(p, num_splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        close(out[:1], reference_output(p)[:1], torch.float32)


def test_default_splits_fill_the_device_and_shrink_with_batch(device):
    assert default_num_splits(1, 4, device) > default_num_splits(64, 4, device)
    assert default_num_splits(256, 8, device) == 1
    for b in (1, 3, 7, 100):
        s = default_num_splits(b, 2, device)
        assert s & (s - 1) == 0

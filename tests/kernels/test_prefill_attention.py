"""Varlen prefill / chunked-prefill attention over the paged cache vs the reference."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.reference.paged_problems import make_problem, reference_output
from officellm.kernels.triton.prefill_attention import paged_prefill_attention
from tests.kernels.conftest import DTYPES, close

# One launch, every kind of sequence: a fresh odd-length prefill, a chunk after a cached
# prefix that ends mid-block, a chunk that starts on a block boundary, and a decode.
MIXED = [(21, 21), (37, 11), (48, 16), (30, 1)]


def _run(p, max_query_len=None):
    return paged_prefill_attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                                   p.query_start_loc, p.scale, max_query_len=max_query_len,
                                   block_n=16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk", [(2, 2), (4, 1), (8, 1)])  # GQA ratios 1, 4, 8
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_matches_reference(device, dtype, hq, hk, head_dim):
    p = make_problem(MIXED, hq, hk, head_dim, dtype, device)
    close(_run(p, p.max_query_len), reference_output(p), dtype)


def test_prefill_odd_group_and_reads_max_len_itself(device):
    """A group of 3 (padded to 4 rows per token), with max_query_len left to the wrapper."""
    p = make_problem([(19, 19), (40, 3)], 6, 2, 16, torch.float32, device, seed=2)
    close(_run(p), reference_output(p), torch.float32)


def test_prefill_long_query_spans_several_tiles(device):
    """More query tokens than one program's tile: tiles past a short sequence's end idle."""
    p = make_problem([(90, 70), (5, 5)], 2, 1, 16, torch.float32, device, block_size=8, seed=4)
    close(_run(p), reference_output(p), torch.float32)

"""The CPU kernels under --batch-invariant: a row's result never depends on the rows beside
it. The fixed-order matmul (kernels/cpu/fixed_order_matmul.cpp) equals F.linear within the
dtype's rounding, gives a row the same bits whatever the call's row count, neighbours and
position, and the same bits on every build level; the decode attention kernel and RMSNorm
give a row the same bits alone or in a batch (both were batch-dependent once)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from officellm.kernels.build import cpu_kernels
from tests.kernels.conftest import cpu_build_levels

LEVELS = cpu_build_levels()
DTYPES = [torch.float32, torch.bfloat16]
# (N, K): SmolLM2's q/k/v and down projections, and a shape that fills no panel or tile.
SHAPES = [(960, 576), (576, 1536), (37, 45)]


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _ in LEVELS])
def kernels(request):
    module = cpu_kernels.load(request.param[1])
    if module is None:
        pytest.fail("the CPU kernels did not build (is a C++ compiler installed?)")
    return module


def _weights(n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n * 1000 + k)
    return (torch.randn(70, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_fixed_order_matmul_equals_linear_within_rounding(kernels, dtype, n, k):
    x, w = _weights(n, k, dtype)
    got = kernels.fixed_order_matmul(x, kernels.fixed_order_pack(w), n)
    assert got.dtype == dtype and got.shape == (70, n)
    exact = F.linear(x.double(), w.double())
    # float32 sums of K products; bf16 adds the result's rounding (8 bits of mantissa).
    tol = 2e-5 * k ** 0.5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), exact, atol=tol * exact.abs().max().item(),
                               rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_fixed_order_matmul_row_ignores_row_count_neighbours_and_position(kernels, dtype, n, k):
    x, w = _weights(n, k, dtype)
    packed = kernels.fixed_order_pack(w)
    row = x[5:6]
    alone = kernels.fixed_order_matmul(row, packed, n)
    g = torch.Generator().manual_seed(1)
    for rows, at in ((2, 1), (3, 0), (9, 8), (17, 8), (70, 33)):
        batch = torch.randn(rows, k, generator=g).to(dtype) * 100
        batch[at] = row[0]
        assert torch.equal(kernels.fixed_order_matmul(batch, packed, n)[at], alone[0]), (rows, at)


@pytest.mark.slow  # builds the portable level too: docs/testing.md
@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_order_matmul_gives_the_same_bits_on_every_level(dtype):
    x, w = _weights(49, 33, dtype)
    results = {}
    for lid, level in LEVELS:
        module = cpu_kernels.load(level)
        results[lid] = module.fixed_order_matmul(x, module.fixed_order_pack(w), 49)
    first = results["native"]
    assert all(torch.equal(first, r) for r in results.values()), list(results)


def test_fixed_order_matmul_of_no_rows_is_empty(kernels):
    _, w = _weights(37, 45, torch.float32)
    out = kernels.fixed_order_matmul(torch.empty(0, 45), kernels.fixed_order_pack(w), 37)
    assert out.shape == (0, 37)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 300], ids=["full", "window-and-sinks"])
def test_decode_attention_row_ignores_the_batch(kernels, dtype, window):
    """Also for a sliding-window layer with sinks (gpt-oss): the 555-token row's 300-key
    window is cut into 3 parts counted from its first visible block, which the row's own
    length alone decides."""
    g = torch.Generator().manual_seed(2)
    blocks, block_size, kv_heads, head_dim, q_heads = 80, 16, 3, 64, 9
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(33, q_heads, head_dim, generator=g).to(dtype)
    tables = torch.randint(0, blocks, (33, 40), generator=g)
    lens = torch.randint(1, 600, (33,), generator=g)
    lens[0] = 555  # several fixed parts, the last one partial
    sinks = torch.randn(q_heads, generator=g) if window else None
    alone = kernels.paged_decode_attention(q[:1], k_cache, v_cache, tables[:1], lens[:1], 0.125,
                                           window, sinks)
    for rows in (2, 5, 33):
        out = kernels.paged_decode_attention(q[:rows].flip(0), k_cache, v_cache,
                                             tables[:rows].flip(0), lens[:rows].flip(0), 0.125,
                                             window, sinks)
        assert torch.equal(out[rows - 1], alone[0]), rows


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_row_ignores_the_batch(kernels, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(457, 576, generator=g).to(dtype)
    w = torch.randn(576, generator=g).to(dtype)
    batch = kernels.rms_norm(x, w, 1e-5)
    changed = [i for i in range(457)
               if not torch.equal(batch[i], kernels.rms_norm(x[i:i + 1].clone(), w, 1e-5)[0])]
    assert changed == []

"""The batch-invariant matmul: F.linear's result, and a row's output bit-identical whatever the
batch around it (its size, the row's position, the other rows' values).

Under the interpreter bf16 is left out (conftest.DTYPES: its tl.dot multiplies bf16's bits
as integers); on a GPU (TRITON_INTERPRET=0) every test runs in bf16 too."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.triton import ops as tri
from officellm.kernels.triton.fixed_order_matmul import TILES
from tests.kernels.conftest import DTYPES, close

# None a multiple of any tile (64 rows, 64 columns, 32 or 64 of K); 70 rows span two row tiles.
M, N, K = 70, 80, 100


def _weights(dtype: torch.dtype, device: torch.device, bias: bool, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype=dtype, device=device)
    b = torch.randn(N, generator=g).to(dtype=dtype, device=device) if bias else None
    return w, b


def _rows(n: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(n, K, generator=g).to(dtype=dtype, device=device)


def test_no_shape_is_a_multiple_of_any_tile():
    for block_m, block_n, block_k, _, _ in TILES.values():
        assert M % block_m and N % block_n and K % block_k and M > block_m


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_equals_linear_in_float64(device, dtype, bias):
    w, b = _weights(dtype, device, bias)
    x = _rows(M, dtype, device, seed=1)
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    got = tri.fixed_order_matmul(x, w, b)
    assert got.shape == (M, N) and got.dtype == dtype
    close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_a_row_is_bit_identical_at_any_batch_size_and_position(device, dtype, bias):
    w, b = _weights(dtype, device, bias)
    row = _rows(1, dtype, device, seed=2)
    alone = tri.fixed_order_matmul(row, w, b)
    seed = 3
    for batch in (3, 17, 70):
        for pos in sorted({0, batch // 2, batch - 1}):
            x = _rows(batch, dtype, device, seed=seed)  # fresh random neighbours each time
            seed += 1
            x[pos] = row[0]
            got = tri.fixed_order_matmul(x, w, b)[pos : pos + 1]
            assert torch.equal(got, alone), f"row {pos} of {batch} differs from the row alone"


# The interpreter's numpy warns of the inf and nan neighbours' own products.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_is_bit_identical_whatever_its_neighbours_hold(device, dtype):
    w, b = _weights(dtype, device, bias=True)
    x = _rows(17, dtype, device, seed=4)
    want = tri.fixed_order_matmul(x, w, b)[5]
    others = torch.arange(17, device=device) != 5
    for fill in (0.0, 1e3, -1e3, float("inf"), float("nan")):
        x[others] = fill
        assert torch.equal(tri.fixed_order_matmul(x, w, b)[5], want), f"neighbours at {fill}"
    x[others] = _rows(16, dtype, device, seed=5) * 100
    assert torch.equal(tri.fixed_order_matmul(x, w, b)[5], want), "random neighbours"


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_x_gives_the_contiguous_result(device, dtype):
    w, b = _weights(dtype, device, bias=True)
    x = _rows(M, dtype, device, seed=6)
    x_t = x.t().contiguous().t()  # same values, K not the unit stride
    assert not x_t.is_contiguous()
    assert torch.equal(tri.fixed_order_matmul(x_t, w, b), tri.fixed_order_matmul(x, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_rows_give_an_empty_result(device, dtype):
    w, b = _weights(dtype, device, bias=True)
    got = tri.fixed_order_matmul(torch.empty(0, K, dtype=dtype, device=device), w, b)
    assert got.shape == (0, N) and got.dtype == dtype

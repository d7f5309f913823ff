"""The Triton MoE experts (kernels/triton/fused_moe.py) against kernels/reference/moe.py, at
toy sizes under the interpreter: 8 experts top-2, hidden 64, expert intermediate 32."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from officellm.kernels.reference import moe as reference
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights
from officellm.kernels.triton import fused_moe
from tests.kernels.conftest import close

E, K, H, INTER = 8, 2, 64, 32
TOKENS = (1, 5, 37)
# Both tile sets at these sizes: moe_tiles picks the decode set for every T here.
TILES = {"decode": None, "prefill": fused_moe.moe_tiles(10**6, E, torch.float16, False)}


def _routed(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x in float32, weights, ids) for t tokens, routed as Qwen3-MoE routes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=g)
    weights, ids = reference.route(torch.randn(t, E, generator=g), K, "softmax_topk", True)
    return x, weights, ids


def _experts(dtype: torch.dtype, bias: bool, seed: int = 0) -> ExpertWeights:
    g = torch.Generator().manual_seed(seed)
    return ExpertWeights(
        w13=(torch.randn(E, 2 * INTER, H, generator=g) * 0.2).to(dtype),
        w2=(torch.randn(E, H, INTER, generator=g) * 0.2).to(dtype),
        b13=torch.randn(E, 2 * INTER, generator=g) if bias else None,
        b2=torch.randn(E, H, generator=g) if bias else None)


def _check(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
           activation: ExpertActivation, tiles: str = "decode",
           want_experts: ExpertWeights | None = None) -> None:
    got = fused_moe.moe_experts(x, weights, ids, experts, activation, tiles=TILES[tiles])
    want = reference.moe_experts(x, weights, ids, want_experts or experts, activation)
    assert got.dtype == x.dtype and got.shape == x.shape
    close(got, want, x.dtype)


@pytest.mark.parametrize(("dtype", "t"), [(torch.float32, t) for t in TOKENS] + [
    (torch.float16, 37), (torch.bfloat16, 5), (torch.bfloat16, 37)])
def test_dense_experts_match_the_reference(dtype: torch.dtype, t: int) -> None:
    x, weights, ids = _routed(t, seed=t)
    _check(x.to(dtype), weights, ids, _experts(dtype, bias=False), ExpertActivation("silu"))


@pytest.mark.parametrize(("kind", "tiles"), [("silu", "decode"), ("gelu_tanh", "decode"),
                                           ("clamped_swiglu", "decode"),
                                           ("clamped_swiglu", "prefill")])
def test_each_activation_with_biases_matches_the_reference(kind: str, tiles: str) -> None:
    x, weights, ids = _routed(37, seed=1)
    # Scaled up so that clamped_swiglu's limit clips some gate and up values.
    _check(x.half() * 4, weights, ids, _experts(torch.float16, bias=True),
           ExpertActivation(kind, alpha=1.702, limit=7.0), tiles)


def test_experts_that_get_no_tokens_are_skipped() -> None:
    x, weights, ids = _routed(37, seed=2)
    ids = ids % 3 * 2 + 1  # experts 1, 3 and 5 only
    assert set(ids.unique().tolist()) == {1, 3, 5}
    _check(x, weights, ids, _experts(torch.float32, bias=True), ExpertActivation("silu"))


@pytest.mark.parametrize("tiles", TILES)
def test_every_token_on_one_expert(tiles: str) -> None:
    """37 tokens of top-1 on expert 6: several full decode blocks and a part-filled one."""
    x, weights, _ = _routed(37, seed=3)
    ids = torch.full((37, 1), 6, dtype=torch.long)
    _check(x, weights[:, :1], ids, _experts(torch.float32, bias=True),
           ExpertActivation("silu"), tiles)


def _mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(GGUF MXFP4 blocks uint8 [..., K / 32 * 17], their dequantized float32 values)."""
    blocks = quants.quantize(w.numpy(), gguf.GGMLQuantizationType.MXFP4)
    values = quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4)
    return torch.from_numpy(blocks), torch.from_numpy(np.ascontiguousarray(values))


@pytest.mark.parametrize(("dtype", "t", "tiles"), [
    (torch.float32, 1, "decode"), (torch.float32, 37, "decode"), (torch.bfloat16, 5, "decode"),
    (torch.bfloat16, 37, "prefill")])
def test_mxfp4_experts_match_a_dense_run_on_their_dequantized_weights(
        dtype: torch.dtype, t: int, tiles: str) -> None:
    """gpt-oss's layer: MXFP4 experts with biases and the clamped SwiGLU. The reference's own
    block path rounds activations to int8 (CPU semantics): it runs on the dequantized
    weights instead, which the kernel's dequantization reproduces exactly."""
    dense = _experts(torch.float32, bias=True, seed=4)
    (w13, w13_values), (w2, w2_values) = _mxfp4(dense.w13), _mxfp4(dense.w2)
    blocks = ExpertWeights(w13, w2, fused_moe.MXFP4, fused_moe.MXFP4, dense.b13, dense.b2)
    dequantized = ExpertWeights(w13_values.to(dtype), w2_values.to(dtype), b13=dense.b13,
                                b2=dense.b2)
    g = torch.Generator().manual_seed(t)
    x = torch.randn(t, H, generator=g).to(dtype)
    weights, ids = reference.route(torch.randn(t, E, generator=g), K, "topk_softmax", False)
    _check(x, weights, ids, blocks, ExpertActivation("clamped_swiglu"), tiles,
           want_experts=dequantized)


@pytest.mark.parametrize("block_m", [16, 64])
def test_the_sort_places_each_pair_once_in_a_block_of_its_expert_in_pair_order(
        block_m: int) -> None:
    _, _, ids = _routed(37, seed=5)
    ids[:, 0] = torch.where(ids[:, 0] == 4, 0, ids[:, 0])  # expert 4 gets fewer pairs
    flat = ids.reshape(-1)
    n = flat.numel()
    s = fused_moe.sort_pairs(ids, E, block_m)
    used = s.block_expert < E
    # Used blocks first, in expert order, then the unused tail (its rows unset).
    assert used.sum() == int(used.long().cumprod(0).sum())
    labels = s.block_expert[used]
    assert torch.equal(labels, labels.sort().values)
    rows = s.pairs.view(-1, block_m)[used]
    real = rows < n
    assert torch.equal(flat[rows[real].long()], labels.repeat_interleave(block_m).view(
        -1, block_m)[real].to(flat.dtype))
    placed = rows[real]
    assert torch.equal(placed.sort().values, torch.arange(n, dtype=placed.dtype))
    for e in labels.unique().tolist():  # each expert's run: its pairs in ascending order
        run = rows[labels == e]
        run = run[run < n]
        assert torch.equal(run, torch.nonzero(flat == e).flatten().to(run.dtype))
    # Padding fills only the end of each expert's last block.
    assert torch.equal(rows[~real], torch.full_like(rows[~real], n))
    expected_blocks = torch.bincount(flat, minlength=E).add(block_m - 1).div(
        block_m, rounding_mode="floor")
    assert torch.equal(torch.bincount(labels.long(), minlength=E), expected_blocks)


def test_a_gguf_format_without_a_triton_kernel_is_refused() -> None:
    x, weights, ids = _routed(1, seed=6)
    q8 = ExpertWeights(torch.zeros(E, 2 * INTER, H // 32 * 34, dtype=torch.uint8),
                       torch.zeros(E, H, INTER // 32 * 34, dtype=torch.uint8), 8, 8)
    with pytest.raises(ValueError, match="GGUF type 8 has no Triton kernel"):
        fused_moe.moe_experts(x, weights, ids, q8, ExpertActivation("silu"))

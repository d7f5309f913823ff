"""The CPU mixture-of-experts kernel (kernels/cpu/moe.cpp) against its torch reference
(kernels/reference/moe.py moe_experts), on this CPU's build level and the lower ones it can
be forced to (OFFICELLM_CPU_ISA), for every block format and dense float32/bf16 experts.

The kernel's projections over blocks are quant_matmul's, bit for bit; its activation is its
own float32 exp/tanh, which may differ from torch's in a last bit and, through the int8
rounding of the down projection's input, move one value by a quantization step: hence a
tolerance against the reference (TOLERANCE), and exact equality where the kernel is compared
with itself (packed and rows, one token and a batch, one thread and two)."""

from __future__ import annotations

import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.ops import _CompiledOps, pack_experts
from officellm.kernels.reference import moe
from officellm.kernels.reference import quant_reference as qr
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights
from officellm.kernels.reference.random_blocks import random_blocks
from tests.kernels.conftest import cpu_build_levels

LEVELS = cpu_build_levels()
BLOCK_FORMATS = [qr.Q4_0, qr.Q4_1, qr.Q8_0, qr.Q4_K, qr.Q6_K, qr.MXFP4]
ACTIVATIONS = [ExpertActivation("silu"), ExpertActivation("gelu_tanh"),
               ExpertActivation("clamped_swiglu", alpha=1.702, limit=7.0)]
E = 8
# Relative to the largest output: a flipped int8 rounding of one activation value moves an
# output by about one quantization step of it times a weight, well under this.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _ in LEVELS])
def ops(request):
    built = cpu_kernels.load(request.param[1])
    if built is None:
        pytest.skip("no C++ compiler: the CPU kernels are not built")
    return _CompiledOps(built)


def _sizes(fmt: int | None) -> tuple[int, int]:
    """(H, I): the K-quants need whole 256-weight groups, the others are kept tiny."""
    return (256, 256) if fmt in (qr.Q4_K, qr.Q6_K) else (64, 96)


def block_experts(fmt: int, seed: int, biases: bool = False) -> ExpertWeights:
    h, i = _sizes(fmt)
    gen = torch.Generator().manual_seed(seed)
    w13 = random_blocks(E * 2 * i, h, fmt, gen).reshape(E, 2 * i, -1)
    w2 = random_blocks(E * h, i, fmt, gen).reshape(E, h, -1)
    return ExpertWeights(w13, w2, fmt, fmt, *_biases(biases, h, i, gen))


def dense_experts(dtype: torch.dtype, seed: int, biases: bool = False) -> ExpertWeights:
    h, i = _sizes(None)
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * i, h, generator=gen) * h ** -0.5).to(dtype)
    w2 = (torch.randn(E, h, i, generator=gen) * i ** -0.5).to(dtype)
    return ExpertWeights(w13, w2, None, None, *_biases(biases, h, i, gen))


def _biases(biases: bool, h: int, i: int, gen: torch.Generator) -> tuple:
    if not biases:
        return None, None
    return torch.randn(E, 2 * i, generator=gen) * 0.5, torch.randn(E, h, generator=gen) * 0.5


def routing(tokens: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], distinct expert ids int64 [T, k]) as a softmax router gives."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, E, generator=gen)
    return moe.route(logits, k, "softmax_topk", renormalize=True)


def _x(tokens: int, h: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(tokens, h, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def assert_matches_reference(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Every value within TOLERANCE of the largest; in float32 nearly all (99%) within float
    rounding of it too: a flipped rounding is rare, a wrong term would show everywhere."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    scale = ref.float().abs().max().item()
    diff = (ours.float() - ref.float()).abs()
    assert diff.max().item() <= TOLERANCE[ref.dtype] * scale, (diff.max().item(), scale)
    if ref.dtype == torch.float32:
        assert (diff <= 1e-5 * scale).float().mean().item() >= 0.99


@pytest.mark.parametrize("fmt", BLOCK_FORMATS, ids=[qr.NAMES[f] for f in BLOCK_FORMATS])
@pytest.mark.parametrize("tokens,k", [(1, 4), (3, 2), (37, 3)])
def test_block_experts_match_the_reference(ops, fmt, tokens, k):
    experts = block_experts(fmt, seed=fmt)
    x = _x(tokens, _sizes(fmt)[0], torch.float32, tokens)
    weights, ids = routing(tokens, k, seed=tokens + k)
    act = ACTIVATIONS[0]
    assert_matches_reference(ops.moe_experts(x, weights, ids, experts, act),
                             moe.moe_experts(x, weights, ids, experts, act))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=[a.kind for a in ACTIVATIONS])
@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "bias"])
def test_each_activation_with_and_without_biases_matches_the_reference(ops, act, biases):
    experts = block_experts(qr.MXFP4, seed=1, biases=biases)
    x = _x(5, _sizes(qr.MXFP4)[0], torch.float32, 2)
    weights, ids = routing(5, 4, seed=3)
    assert_matches_reference(ops.moe_experts(x, weights, ids, experts, act),
                             moe.moe_experts(x, weights, ids, experts, act))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=[a.kind for a in ACTIVATIONS])
@pytest.mark.parametrize("tokens", [1, 37])
def test_dense_experts_match_the_reference(ops, dtype, act, tokens):
    experts = dense_experts(dtype, seed=4, biases=act.kind == "clamped_swiglu")
    x = _x(tokens, _sizes(None)[0], dtype, 5)
    weights, ids = routing(tokens, 2, seed=6)
    assert_matches_reference(ops.moe_experts(x, weights, ids, experts, act),
                             moe.moe_experts(x, weights, ids, experts, act))


def test_a_bf16_input_over_blocks_gives_bf16_close_to_the_reference(ops):
    experts = block_experts(qr.Q8_0, seed=7, biases=True)
    x = _x(6, _sizes(qr.Q8_0)[0], torch.bfloat16, 8)
    weights, ids = routing(6, 2, seed=9)
    assert_matches_reference(ops.moe_experts(x, weights, ids, experts, ACTIVATIONS[0]),
                             moe.moe_experts(x, weights, ids, experts, ACTIVATIONS[0]))


@pytest.mark.parametrize("fmt", [qr.Q4_K, None], ids=["Q4_K", "dense"])
def test_every_token_on_one_expert_and_experts_without_tokens(ops, fmt):
    """Expert 5 gets all 9 tokens, 0 and 7 one slot each, the others none."""
    experts = block_experts(fmt, seed=10) if fmt else dense_experts(torch.float32, seed=10)
    x = _x(9, _sizes(fmt)[0], torch.float32, 11)
    ids = torch.tensor([[5, 0]] + [[5, 3 - (t % 2)] for t in range(7)] + [[7, 5]])
    weights = torch.rand(9, 2, generator=torch.Generator().manual_seed(12))
    assert_matches_reference(ops.moe_experts(x, weights, ids, experts, ACTIVATIONS[0]),
                             moe.moe_experts(x, weights, ids, experts, ACTIVATIONS[0]))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS, ids=[qr.NAMES[f] for f in BLOCK_FORMATS])
def test_packed_experts_give_the_rows_result_bit_for_bit(ops, fmt):
    """quant_pack's layout per expert holds the same blocks: the same float operations (the
    portable build packs nothing and keeps the rows)."""
    experts = block_experts(fmt, seed=13, biases=True)
    packed = moe_pack(ops, experts)
    assert packed.w13.dim() == (3 if ops._module.quant_matmul_path() == "portable" else 4)
    x = _x(11, _sizes(fmt)[0], torch.float32, 14)
    weights, ids = routing(11, 3, seed=15)
    act = ACTIVATIONS[2]
    assert torch.equal(ops.moe_experts(x, weights, ids, packed, act),
                       ops.moe_experts(x, weights, ids, experts, act))


def moe_pack(ops: _CompiledOps, experts: ExpertWeights) -> ExpertWeights:
    """KernelOps.moe_pack of this level's module."""
    return pack_experts(ops._module.quant_pack)(experts)


@pytest.mark.parametrize("fmt", [qr.Q6_K, qr.MXFP4, None], ids=["Q6_K", "MXFP4", "dense"])
def test_a_token_gets_the_same_result_alone_as_in_a_batch(ops, fmt):
    """Each (token, expert) pair is computed on its own, in the same operations: the output
    does not depend on the other tokens (nor on how the work was shared among threads)."""
    experts = block_experts(fmt, seed=16) if fmt else dense_experts(torch.float32, seed=16)
    x = _x(21, _sizes(fmt)[0], torch.float32, 17)
    weights, ids = routing(21, 4, seed=18)
    act = ACTIVATIONS[0]
    batch = ops.moe_experts(x, weights, ids, experts, act)
    for t in (0, 13, 20):
        alone = ops.moe_experts(x[t:t + 1], weights[t:t + 1], ids[t:t + 1], experts, act)
        assert torch.equal(alone[0], batch[t])


def test_one_thread_and_two_give_the_same_bits(ops):
    experts = block_experts(qr.Q4_0, seed=19, biases=True)
    x = _x(37, _sizes(qr.Q4_0)[0], torch.float32, 20)
    weights, ids = routing(37, 4, seed=21)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.moe_experts(x, weights, ids, experts, ACTIVATIONS[1])
        torch.set_num_threads(2)
        two = ops.moe_experts(x, weights, ids, experts, ACTIVATIONS[1])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_an_empty_batch_gives_an_empty_result(ops):
    experts = block_experts(qr.Q8_0, seed=22)
    weights, ids = routing(0, 2, seed=0)
    out = ops.moe_experts(torch.empty(0, 64), weights, ids, experts, ACTIVATIONS[0])
    assert out.shape == (0, 64)


def test_an_expert_id_out_of_range_is_refused(ops):
    experts = block_experts(qr.Q8_0, seed=23)
    with pytest.raises(RuntimeError, match="expert id 8 not in"):
        ops.moe_experts(torch.randn(1, 64), torch.ones(1, 1), torch.tensor([[8]]), experts,
                        ACTIVATIONS[0])

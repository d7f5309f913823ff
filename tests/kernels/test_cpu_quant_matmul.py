"""The quantized matmul (kernels/cpu/quant_matmul.cpp) equals its torch reference
(kernels/reference/quant_reference.py) bit for bit on every build level this CPU can run; the lower
levels are forced (OFFICELLM_CPU_ISA) so an AVX-512 machine also tests the AVX2 and
portable code, and a level this CPU lacks is not collected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.reference import quant_reference as qr
from officellm.kernels.reference.random_blocks import random_blocks
from tests.kernels.conftest import cpu_build_levels

FORMATS = [qr.Q8_0, qr.Q4_0, qr.Q4_1, qr.Q4_K, qr.Q6_K, qr.MXFP4]
# M (rows of x) 1, a partial tile, a full office batch, one past it; K one group, several
# (the 32-weight formats' K also a block, the K-quants' a 256-weight group).
SHAPES = [(1, 40, 1), (3, 17, 3), (16, 64, 18), (17, 33, 6)]
LEVEL_PATHS = {"x86-64": "portable", "avx2": "avx2"}


def _levels() -> list[tuple[str, cpu_kernels.BuildLevel, str]]:
    """(test id, level, the path it must run) for this CPU's own level and the lower ones."""
    native = cpu_kernels.build_level()
    native_path = "avx512_vnni" if "vnni" in native.name else LEVEL_PATHS.get(native.name, "avx2")
    return [(lid, level, native_path if lid == "native" else LEVEL_PATHS[lid])
            for lid, level in cpu_build_levels()]


LEVELS = _levels()


@pytest.fixture(scope="module", params=LEVELS, ids=[lid for lid, _, _ in LEVELS])
def module(request):
    _, level, path = request.param
    built = cpu_kernels.load(level)
    if built is None:
        pytest.skip("no C++ compiler: the CPU kernels are not built")
    assert built.quant_matmul_path() == path
    return built


def _in_features(fmt: int, groups: int) -> int:
    return groups * qr.GROUP_WEIGHTS[fmt]


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{g}groups" for m, n, g in SHAPES])
def test_quant_matmul_equals_the_reference_bit_for_bit(module, fmt, shape):
    """Same float operations in the same order (the kernel's header): equal, not close."""
    m, n, groups = shape
    k = _in_features(fmt, groups)
    gen = torch.Generator().manual_seed(m * 1000 + n + fmt)
    weight = random_blocks(n, k, fmt, gen)
    x = torch.randn(m, k, generator=gen) * 3
    ours = module.quant_matmul(x, weight, fmt)
    ref = qr.quant_matmul(x, weight, fmt)
    assert torch.equal(ours, ref)


# SHAPES with whole groups of eight weight rows, the only ones quant_pack packs.
PACKED_SHAPES = [(1, 40, 1), (3, 16, 3), (16, 64, 18), (17, 32, 6)]


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
@pytest.mark.parametrize("shape", PACKED_SHAPES,
                         ids=[f"{m}x{n}x{g}groups" for m, n, g in PACKED_SHAPES])
def test_a_packed_weight_gives_the_reference_bit_for_bit(module, fmt, shape):
    """The vector paths' packed layout holds the same bytes in another order: same result."""
    m, n, groups = shape
    k = _in_features(fmt, groups)
    gen = torch.Generator().manual_seed(m * 1000 + n + fmt)
    weight = random_blocks(n, k, fmt, gen)
    x = torch.randn(m, k, generator=gen) * 3
    packed = module.quant_pack(weight, fmt)
    if module.quant_matmul_path() == "portable":
        assert packed is weight  # nothing to gain one row at a time: the rows as they are
    else:
        unit = qr.QK * qr.PACKED_UNIT_BLOCKS[fmt]
        assert packed.shape == (n // 8, k // unit, packed.shape[2])
    assert torch.equal(module.quant_matmul(x, packed, fmt), qr.quant_matmul(x, weight, fmt))


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_a_packed_weight_reads_at_most_6_percent_more_bytes_than_its_rows(module, fmt):
    """One row of x (a user typing) is bound by the bytes a matmul reads: the packed layout
    may not cost many more than GGUF's rows (the K-quants' float super-block scales)."""
    if module.quant_matmul_path() == "portable":
        pytest.skip("the portable build packs nothing")
    weight = random_blocks(16, _in_features(fmt, 2), fmt, torch.Generator().manual_seed(fmt))
    assert module.quant_pack(weight, fmt).numel() <= 1.06 * weight.numel()


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_the_reference_unpacks_a_packed_weight_as_its_rows(module, fmt):
    """Integers, scales and offsets (and so an embedding lookup's rows) read out of the
    packed layout equal those of the GGUF rows, for all rows and for a few picked."""
    if module.quant_matmul_path() == "portable":
        pytest.skip("the portable build packs nothing (tested above)")
    weight = random_blocks(24, _in_features(fmt, 3), fmt, torch.Generator().manual_seed(fmt))
    packed = module.quant_pack(weight, fmt)
    for ids in (None, torch.tensor([17, 0, 9, 23, 9])):
        for ours, theirs in zip(qr.unpack(packed, fmt, ids), qr.unpack(weight, fmt, ids)):
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize("fmt", [qr.Q4_1, qr.Q6_K], ids=[qr.NAMES[f] for f in (qr.Q4_1, qr.Q6_K)])
def test_rows_not_a_multiple_of_8_stay_in_gguf_rows(module, fmt):
    n = 12
    weight = random_blocks(n, _in_features(fmt, 1), fmt, torch.Generator().manual_seed(n))
    assert module.quant_pack(weight, fmt) is weight


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_a_bf16_input_gives_the_float32_result_rounded_to_bf16(module, packed):
    gen = torch.Generator().manual_seed(3)
    weight = random_blocks(16, 64, qr.Q4_1, gen)
    x = (torch.randn(5, 64, generator=gen) * 3).to(torch.bfloat16)
    w = module.quant_pack(weight, qr.Q4_1) if packed else weight
    y = module.quant_matmul(x, w, qr.Q4_1)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, qr.quant_matmul(x.float(), weight, qr.Q4_1).to(torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_an_exactly_representable_input_gives_the_dequantized_matmul(module, fmt):
    """x whose blocks quantize without loss (integers up to 127): the kernel is then the
    plain matmul on the dequantized weights (which the gguf library checks below), so the
    kernel reads each format's layout as llama.cpp writes it."""
    gen = torch.Generator().manual_seed(7)
    k = _in_features(fmt, 2)
    weight = random_blocks(8, k, fmt, gen)
    x = torch.randint(-127, 128, (4, k), generator=gen).float()
    x[:, ::32] = 127  # every block's max is 127: scale 1, exact integers
    w = qr.dequantize(weight, fmt)
    dense = x @ w.t()
    # float32 rounding of sums in another order: bounded by the sums of |products|.
    bound = 1e-5 * (x.abs() @ w.abs().t()) + 1e-4
    assert torch.all((module.quant_matmul(x, weight, fmt) - dense).abs() <= bound)


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_mxfp4_extreme_exponents_give_the_reference_bit_for_bit(module, packed):
    """E8M0 bytes 0 and 1 are subnormal scales (2^-128, 2^-127), decoded from their bits on
    the vector paths as well: the same floats as the reference's."""
    gen = torch.Generator().manual_seed(5)
    weight = random_blocks(16, 128, qr.MXFP4, gen).reshape(16, 4, 17)
    weight[..., 0] = torch.tensor([0, 1, 2, 128], dtype=torch.uint8)
    weight = weight.reshape(16, -1).contiguous()
    x = torch.randn(3, 128, generator=gen) * 3
    w = module.quant_pack(weight, qr.MXFP4) if packed else weight
    assert torch.equal(module.quant_matmul(x, w, qr.MXFP4), qr.quant_matmul(x, weight, qr.MXFP4))


def test_an_empty_batch_gives_an_empty_result(module):
    weight = random_blocks(8, 64, qr.Q8_0, torch.Generator().manual_seed(0))
    assert module.quant_matmul(torch.empty(0, 64), weight, qr.Q8_0).shape == (0, 8)


def test_a_type_without_a_kernel_is_refused(module):
    with pytest.raises(RuntimeError, match="no kernel for GGUF type 13"):  # Q5_K
        module.quant_matmul(torch.randn(1, 256), torch.zeros(4, 176, dtype=torch.uint8), 13)


def test_a_k_quant_needs_whole_256_weight_groups(module):
    with pytest.raises(RuntimeError, match="multiple of 256"):
        module.quant_matmul(torch.randn(1, 288), torch.zeros(4, 162, dtype=torch.uint8), qr.Q4_K)


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_the_reference_dequantizes_as_the_gguf_library_does(fmt):
    from gguf import GGMLQuantizationType, quants

    weight = random_blocks(6, _in_features(fmt, 3), fmt, torch.Generator().manual_seed(fmt))
    theirs = quants.dequantize(weight.numpy(), GGMLQuantizationType(fmt))
    assert np.array_equal(qr.dequantize(weight, fmt).numpy(), theirs.astype(np.float32))


@pytest.mark.parametrize("quantize,fmt,step", [(qr.quantize_q8_0, qr.Q8_0, 127),
                                                (qr.quantize_q4_1, qr.Q4_1, 15)])
def test_quantizing_at_load_rounds_each_weight_to_its_nearest_level(quantize, fmt, step):
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(1))
    back = qr.dequantize(quantize(w), fmt)
    blocks = w.reshape(16, -1, qr.QK)
    spread = blocks.abs().amax(-1) if fmt == qr.Q8_0 else blocks.amax(-1) - blocks.amin(-1)
    level = (spread / step).repeat_interleave(qr.QK, dim=1)
    assert torch.all((back - w).abs() <= 0.5 * level * 1.01 + 1e-3 * level)


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_the_matmul_errs_no_more_than_rounding_its_input_to_int8(fmt):
    """The only approximation is x's rounding to int8 per block (as llama.cpp's): the result
    errs within 1% as much as x rounded, then multiplied exactly. The offset of Q4_1 and
    Q4_K taken from x's float sum instead of the quantized block's erred 1.6x and 1.04x as
    much here (2.5x on the bundled model's activations)."""
    gen = torch.Generator().manual_seed(0)
    n, k = 64, 512
    weight = random_blocks(n, k, fmt, gen)
    w = qr.dequantize(weight, fmt).double()
    # Activations have outliers.
    x = torch.randn(8, k, generator=gen) * (1 + 4 * (torch.rand(k, generator=gen) > 0.97))
    q, d, _ = qr.quantize_rows(x)
    rounded = (q.double() * d.double().unsqueeze(-1)).reshape(8, k)
    exact = x.double() @ w.T
    floor = ((rounded @ w.T) - exact).norm()
    assert (qr.quant_matmul(x, weight, fmt).double() - exact).norm() <= 1.01 * floor

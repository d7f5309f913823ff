"""The quantized matmul (kernels/cpu_quant_matmul.cpp) equals its torch reference
(kernels/quant_reference.py) bit for bit on every build level this CPU can run; the lower
levels are forced (OFFICELLM_CPU_ISA) so an AVX-512 machine also tests the AVX2 and
portable code, and a level this CPU lacks is not collected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import cpu_kernels
from kernels import quant_reference as qr
from tests.kernels.conftest import cpu_build_levels

FORMATS = [qr.Q8_0, qr.Q4_0, qr.Q4_1]
# M (rows of x) 1, a partial tile, a full office batch, one past it; K a block, several.
SHAPES = [(1, 40, 32), (3, 17, 96), (16, 64, 576), (17, 33, 1536)]
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


def random_blocks(n: int, k: int, fmt: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of `fmt` blocks with random integers and fp16 scales (and offsets)."""
    nb = k // qr.QK
    raw = torch.randint(0, 256, (n, nb, qr.BLOCK_BYTES[fmt]), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, nb, 2, generator=gen) * 0.02 + 0.001).to(torch.float16)
    if fmt == qr.Q4_1:
        scales[..., 1] = -scales[..., 1] * 8  # an offset near -8 d, as real blocks have
    raw[..., :4 if fmt == qr.Q4_1 else 2] = scales.view(torch.uint8)[..., :4 if fmt == qr.Q4_1
                                                                      else 2]
    if fmt == qr.Q8_0:
        q = raw[..., 2:].view(torch.int8)
        q[q == -128] = -127  # what llama.cpp's quantizer writes
    return raw.reshape(n, -1).contiguous()


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_quant_matmul_equals_the_reference_bit_for_bit(module, fmt, shape):
    """Same float operations in the same order (the kernel's header): equal, not close."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 1000 + n + fmt)
    weight = random_blocks(n, k, fmt, gen)
    x = torch.randn(m, k, generator=gen) * 3
    ours = module.quant_matmul(x, weight, fmt)
    ref = qr.quant_matmul(x, weight, fmt)
    assert torch.equal(ours, ref)


def test_an_exactly_representable_input_gives_the_dequantized_matmul(module):
    """x whose blocks quantize without loss (integers up to 127): the kernel is then the
    plain matmul on the dequantized weights."""
    gen = torch.Generator().manual_seed(7)
    weight = random_blocks(8, 64, qr.Q4_1, gen)
    x = torch.randint(-127, 128, (4, 64), generator=gen).float()
    x[:, ::32] = 127  # every block's max is 127: scale 1, exact integers
    dense = x @ qr.dequantize(weight, qr.Q4_1).t()
    assert torch.allclose(module.quant_matmul(x, weight, qr.Q4_1), dense, rtol=1e-5, atol=1e-4)


def test_an_empty_batch_gives_an_empty_result(module):
    weight = random_blocks(8, 64, qr.Q8_0, torch.Generator().manual_seed(0))
    assert module.quant_matmul(torch.empty(0, 64), weight, qr.Q8_0).shape == (0, 8)


def test_a_type_without_a_kernel_is_refused(module):
    with pytest.raises(RuntimeError, match="no kernel for GGUF type 14"):
        module.quant_matmul(torch.randn(1, 256), torch.zeros(4, 210, dtype=torch.uint8), 14)


@pytest.mark.parametrize("fmt", FORMATS, ids=[qr.NAMES[f] for f in FORMATS])
def test_the_reference_dequantizes_as_the_gguf_library_does(fmt):
    from gguf import GGMLQuantizationType, quants

    weight = random_blocks(6, 96, fmt, torch.Generator().manual_seed(fmt))
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

// y = x W^T with W kept in GGUF's blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, MXFP4), never
// dequantized.
//
// Why integer dot products: a decode step reads every weight once, so a 4.5-bit weight
// reads 7x fewer bytes than float32, and at office batch sizes (16-32 rows) the step is also
// compute-bound, where one AVX2 vpmaddubsw does 32 multiply-adds (an fp32 FMA: 8). The rows
// of x are therefore quantized first, per 32-value block, to int8 with one float scale
// (d = max|x| / 127, q = round(x / d)), as llama.cpp does; each (weight block, x block) pair
// is then an exact integer dot times the two scales. The unsigned formats' offset term (Q4_1,
// Q4_K: w = d q + m) multiplies the sum of the quantized block (d_x times its integer sum), as
// llama.cpp's q8_1 does, not x's float sum: the whole dot then reads one x, and the rounding
// of x meets the centred weights d q + m, not the all-positive d q. With x's float sum a Q4_1
// matmul's error was 2.5x that of rounding x alone, and the model's KL divergence from its
// float32 self 5x llama.cpp's (docs/performance.md, fidelity).
//
// Every format is read as 32-weight blocks (kernels/quant_reference.py's header has the
// layouts): a K-quant's 256 weights are eight such blocks whose scales d * sc are exact in
// float32, Q6_K's two 16-weight halves each with its own scale (two "segments" of a block;
// the other formats have one), so no format needs a path of its own past the decoding.
// MXFP4's levels (FP4 doubled: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) are integers too, its scale a
// power of two: a 32-weight block like Q4_0's, its nibbles looked up (vpshufb) as level + 12.
//
// Eight weight rows are one vector's eight lanes: the rows' blocks are transposed in
// registers so that a step's vector holds, in lane l, row l's four weights 4s..4s+3, and one
// x dword broadcast against it advances eight rows' dots at once; a block's whole dot then
// sums in integers (exact) before one conversion, one scale product and one add per eight
// rows. An unsigned-stored signed format (Q4_0's q - 8, Q6_K's q - 32) sums q and subtracts
// the offset times the x half's integer sum: the same exact integer.
//
// Every float operation happens in one fixed order, the same on every path, and
// kernels/quant_reference.py performs the same operations in torch: the results are equal
// bit for bit, so greedy output over blocks equals the reference's token for token. The
// order: for each block in turn, and each of its segments, acc = acc + dot * (d_w * d_x),
// dot the segment's exact integer dot converted to float, rounding after each product and
// sum (no fused multiply-add); Q4_1/Q4_K then add the offset term, summed over blocks in
// block order, of m * sum(x block), each block's sum d_x * (its integer sum). This file is
// compiled without -ffast-math (kernels/build/cpu_kernels.py gives it no reassociation, no
// reciprocal approximations and no fused multiply-adds, whatever the other kernels get).
//
// Paths, chosen when the module is built (kernels/build/cpu_kernels.py builds one module per CPU
// level and loads the one this CPU's flags, after OFFICELLM_CPU_ISA, allow): AVX-512 VNNI
// (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd) and portable C++.
//
// Each path is a file of its own, included below: quant_matmul_avx2.h (AVX2, and AVX-512
// VNNI where the build has it) or quant_matmul_portable.h; what they share (the formats, x's
// quantized rows, the blocks' scales) is quant_matmul_formats.h.

#include "entry_points.h"
#include "quant_matmul_formats.h"

#if defined(OFFICELLM_QMM_AVX2)
#include "quant_matmul_avx2.h"
#else
#include "quant_matmul_portable.h"
#endif

namespace {

template <int64_t F>
void run(const uint8_t* w, int64_t row_bytes, const XBlocks& xq, float* y, int64_t M,
         int64_t N, int64_t nb) {
  // Tasks of whole 8-row groups, so every task but the last runs full tiles.
  constexpr int64_t G = 8;
  at::parallel_for(0, (N + G - 1) / G, 4, [&](int64_t begin, int64_t end) {
    matmul_rows<F>(w, row_bytes, xq, y, M, N, nb, begin * G, std::min(N, end * G));
  });
}

}  // namespace

static at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight,
                                  int64_t format);

// weight: uint8 [N, row bytes] of `format` groups (a GGUF tensor's rows). Returns the packed
// layout (quant_matmul_avx2.h), uint8 [N / 8, K / unit weights, unit bytes], where this build
// has one for the format and N is a multiple of 8; else `weight` itself (quant_matmul reads
// both).
at::Tensor quant_pack(at::Tensor weight, int64_t format) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "weight must be contiguous uint8 [N, row bytes]");
  return pack_weight(weight, format);
}

// x [M, K] float32, bfloat16 or float16; weight: uint8 [N, K / group weights * group bytes]
// of `format` groups (a GGUF tensor's rows), or quant_pack's layout of them. Returns [M, N]
// in x's dtype (computed in float32).
at::Tensor quant_matmul(at::Tensor x, at::Tensor weight, int64_t format) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), "x must be float [M, K]");
  // A bf16 model's rows: converted here rather than by two more ops in Python per matmul
  // (a one-row decode step makes 121 of these calls on SmolLM2); float32 inside either way.
  if (x.scalar_type() != at::kFloat) {
    return float_matmul(x.to(at::kFloat), weight, format).to(x.scalar_type());
  }
  return float_matmul(x, weight, format);
}

// quant_matmul of a float32 x.
static at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight,
                                  int64_t format) {
  if (weight.dim() == 3) return packed_matmul(x, weight, format);
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "weight must be contiguous uint8 [N, row bytes]");
  const int64_t gw = group_weights(format);
  TORCH_CHECK(gw > 0, "no kernel for GGUF type ", format);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(K % gw == 0, "K must be a multiple of ", gw, " for GGUF type ", format);
  const int64_t nb = K / QK;
  const int64_t row_bytes = K / gw * group_bytes(format);
  TORCH_CHECK(weight.size(1) == row_bytes, "weight rows hold ", weight.size(1),
              " bytes, expected ", row_bytes);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const QuantizedRows xq = quantize_rows(x.contiguous());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  with_format(format, [&](auto f) {
    run<decltype(f)::value>(w, row_bytes, xq.view(), yp, M, N, nb);
  });
  return y;
}

// Which of the paths this module was built with.
std::string quant_matmul_path() {
  return kQuantMatmulPath;
}

// The GGUF block formats as quant_matmul.cpp reads them, and what each of its ISA paths
// shares: x quantized per block, the weight blocks' decoded scales. half_to_float and
// quantize_block are declared here and defined by the path (quant_matmul_avx2.h,
// quant_matmul_portable.h).
//
// Everything below is in an anonymous namespace on purpose: each kernel file that includes
// this compiles its own copy under its own flags (kernels/build/cpu_kernels.py), so no
// inline definition is shared between files built differently, which the linker would
// otherwise resolve to one of them.

#pragma once

#include "entry_points.h"

#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define OFFICELLM_QMM_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define OFFICELLM_QMM_VNNI 1
#endif
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t QK = 32;  // weights per block, the unit of every dot here
// d = max|x| * (1/127), as the reference computes it.
constexpr float INV127 = 1.f / 127.f;

// GGUF's type ids (ggml_type).
constexpr int64_t GGML_Q4_0 = 2;
constexpr int64_t GGML_Q4_1 = 3;
constexpr int64_t GGML_Q8_0 = 8;
constexpr int64_t GGML_Q4_K = 12;
constexpr int64_t GGML_Q6_K = 14;
constexpr int64_t GGML_MXFP4 = 39;

// Weights per stored group: one block, or a K-quant's 256 (eight blocks).
constexpr int64_t group_weights(int64_t format) {
  return format == GGML_Q4_K || format == GGML_Q6_K ? 256
         : format == GGML_Q4_0 || format == GGML_Q4_1 || format == GGML_Q8_0 ||
                   format == GGML_MXFP4
             ? 32
             : 0;
}

constexpr int64_t group_bytes(int64_t format) {
  switch (format) {
    case GGML_Q4_0: return 18;   // fp16 d, 16 bytes of nibbles
    case GGML_Q4_1: return 20;   // fp16 d, fp16 m, 16 bytes of nibbles
    case GGML_Q8_0: return 34;   // fp16 d, 32 int8
    case GGML_Q4_K: return 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit pairs, 128 of nibbles
    case GGML_Q6_K: return 210;  // 128 bytes low nibbles, 64 high bit pairs, 16 int8, fp16 d
    case GGML_MXFP4: return 17;  // E8M0 exponent, 16 bytes of nibbles (levels, not integers)
    default: return 0;
  }
}

// Calls fn(std::integral_constant<int64_t, F>{}) for `format` (one the caller checked has a
// kernel: group_weights(format) > 0), so each format's code is a template instance.
template <typename Fn>
inline void with_format(int64_t format, Fn&& fn) {
  switch (format) {
    case GGML_Q4_0: fn(std::integral_constant<int64_t, GGML_Q4_0>{}); break;
    case GGML_Q4_1: fn(std::integral_constant<int64_t, GGML_Q4_1>{}); break;
    case GGML_Q4_K: fn(std::integral_constant<int64_t, GGML_Q4_K>{}); break;
    case GGML_Q6_K: fn(std::integral_constant<int64_t, GGML_Q6_K>{}); break;
    case GGML_MXFP4: fn(std::integral_constant<int64_t, GGML_MXFP4>{}); break;
    default: fn(std::integral_constant<int64_t, GGML_Q8_0>{}); break;
  }
}

// Unsigned integers with a per-block offset (w = d q + m); the others are signed.
template <int64_t F>
constexpr bool HAS_OFFSET = F == GGML_Q4_1 || F == GGML_Q4_K;

// Where block b of a row starts its group.
template <int64_t F>
inline const uint8_t* group_of(const uint8_t* row, int64_t b) {
  return row + b / (group_weights(F) / QK) * group_bytes(F);
}

// The fp16 at p as a float.
float half_to_float(const uint8_t* p);

// MXFP4's E8M0 exponent byte e as the float 2^(e - 128) (its levels are FP4 doubled): the
// bits (e - 1) << 23, or for e < 2 the subnormals 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// MXFP4's levels by nibble, plus 12: stored unsigned (0..24) for the unsigned-by-signed
// byte products, the 12 taken off through x's integer sums as Q4_0's 8 is.
constexpr int32_t MXFP4_BIAS = 12;
alignas(16) constexpr uint8_t MXFP4_BIASED[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                                  12, 11, 10, 9,  8,  6,  4,  0};

// The rows of x a matmul reads, quantized per block (QuantizedRows below, or a share of the
// rows the MoE kernel gathered for one expert): int8 values, the block's scale, the sum of
// the quantized block (Q4_1's and Q4_K's offset) and the integer sums of its two halves
// (Q4_0's, Q6_K's and MXFP4's unsigned storage). Scales and sums are block-major so a
// tile's x rows are neighbours. Raw pointers: a tile reads them per block (a tensor's
// data_ptr is an out-of-line call with checks, and was being made per tile).
struct XBlocks {
  const int8_t* q;      // [M, K]
  const float* d;       // [nb * M]: block b's scale of row m at b * M + m
  const float* sum;     // [nb * M], as d
  const int32_t* isum;  // [2 * nb * M]: half h of block b of row m at (2b + h) * M + m
};

// The buffers behind an XBlocks of M rows.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> sum;
  std::vector<int32_t> isum;

  XBlocks view() const { return {q.data(), d.data(), sum.data(), isum.data()}; }
};

// One 32-value block of x quantized: its int8 values, scale d, sum and the integer sums of
// its two halves. The sum is the quantized block's, d * (halves[0] + halves[1]): one
// rounding, the same in the reference (quant_matmul.cpp says why not x's float sum).
struct QuantizedBlock {
  float d, sum;
  int32_t halves[2];
};

inline QuantizedBlock quantize_block(const float* src, int8_t* q);

QuantizedRows quantize_rows(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  QuantizedRows out{std::vector<int8_t>(M * K), std::vector<float>(nb * M),
                    std::vector<float>(nb * M), std::vector<int32_t>(2 * nb * M)};
  const float* xp = x.data_ptr<float>();
  int8_t* qp = out.q.data();
  float* dp = out.d.data();
  float* sp = out.sum.data();
  int32_t* ip = out.isum.data();
  // A block takes a few dozen cycles: a few rows' worth is not worth waking the other threads.
  at::parallel_for(0, M * nb, 512, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Rows are contiguous: block i of the flat [M * nb].
      const QuantizedBlock blk = quantize_block(xp + i * QK, qp + i * QK);
      const int64_t b = i % nb, m = i / nb;
      dp[b * M + m] = blk.d;
      sp[b * M + m] = blk.sum;
      ip[2 * b * M + m] = blk.halves[0];
      ip[(2 * b + 1) * M + m] = blk.halves[1];
    }
  });
  return out;
}

// One block's float scales: lanes 0-3 and 4-7 (equal but for Q6_K's 16-weight halves) and
// the offset m of the unsigned formats (0 for the others).
struct BlockScales {
  float lo, hi, m;
};

// Every block's scales of one weight row, decoded once per tile of rows and read by each x
// row of it (a K-quant's 6-bit packing would otherwise be unpacked once per x tile).
template <int64_t F>
void decode_row_scales(const uint8_t* row, int64_t nb, BlockScales* out) {
  if constexpr (F == GGML_Q4_K) {
    for (int64_t g = 0; g < nb / 8; ++g) {
      const uint8_t* grp = row + g * group_bytes(F);
      const float d = half_to_float(grp), dmin = half_to_float(grp + 2);
      // Bytes 0-3 and 4-7 hold blocks 0-3's scales and mins in their low six bits; bytes
      // 8-11 blocks 4-7's low four bits (scale: low nibble, min: high nibble), their top two
      // bits being the top two of bytes 0-3 (scales) and 4-7 (mins).
      const uint8_t* s = grp + 4;
      for (int j = 0; j < 8; ++j) {
        const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        BlockScales& o = out[g * 8 + j];
        o.lo = o.hi = d * static_cast<float>(sc);
        o.m = -(dmin * static_cast<float>(mn));
      }
    }
  } else if constexpr (F == GGML_Q6_K) {
    for (int64_t g = 0; g < nb / 8; ++g) {
      const uint8_t* grp = row + g * group_bytes(F);
      const float d = half_to_float(grp + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(grp + 192);
      for (int j = 0; j < 8; ++j) {
        BlockScales& o = out[g * 8 + j];
        o.lo = d * static_cast<float>(sc[2 * j]);
        o.hi = d * static_cast<float>(sc[2 * j + 1]);
        o.m = 0.f;
      }
    }
  } else if constexpr (F == GGML_MXFP4) {
    for (int64_t b = 0; b < nb; ++b) {
      BlockScales& o = out[b];
      o.lo = o.hi = e8m0_half(row[b * group_bytes(F)]);
      o.m = 0.f;
    }
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* g = row + b * group_bytes(F);
      BlockScales& o = out[b];
      o.lo = o.hi = half_to_float(g);
      o.m = F == GGML_Q4_1 ? half_to_float(g + 2) : 0.f;
    }
  }
}

// Scales of one group of eight weight rows, block-major: block b's eight rows at b * 8, in
// the lane order of the vectors below (lane l: row l of the group).
struct GroupScales {
  std::vector<float> lo, hi, m;  // hi: Q6_K's second 16 weights; m: Q4_1/Q4_K's offsets

  explicit GroupScales(int64_t nb) : lo(nb * 8), hi(nb * 8), m(nb * 8) {}

  template <int64_t F>
  void decode(const uint8_t* const* rows, int64_t nb, std::vector<BlockScales>& row_scales) {
    for (int l = 0; l < 8; ++l) {
      decode_row_scales<F>(rows[l], nb, row_scales.data());
      for (int64_t b = 0; b < nb; ++b) {
        lo[b * 8 + l] = row_scales[b].lo;
        hi[b * 8 + l] = row_scales[b].hi;
        m[b * 8 + l] = row_scales[b].m;
      }
    }
  }
};

// Integer sums of x's quantized halves the signed formats stored as unsigned need: Q4_0's
// q - 8 is summed as q, less 8 times the block's sum of x; Q6_K's q - 32 likewise per half;
// MXFP4's level + 12 as Q4_0's.
template <int64_t F>
inline int32_t unsigned_correction(const int32_t* isum, int64_t b, int64_t M, int64_t m,
                                   int half) {
  if constexpr (F == GGML_Q4_0 || F == GGML_MXFP4) {
    constexpr int32_t bias = F == GGML_Q4_0 ? 8 : MXFP4_BIAS;
    return bias * (isum[2 * b * M + m] + isum[(2 * b + 1) * M + m]);
  } else if constexpr (F == GGML_Q6_K) {
    return 32 * isum[(2 * b + half) * M + m];
  } else {
    return 0;
  }
}

}  // namespace

// quant_matmul's portable C++ path: the same integers and float operations as the vector
// paths, one weight row at a time. quant_matmul.cpp includes it when the build has no AVX2.

#pragma once

#include "quant_matmul_formats.h"

namespace {

float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline QuantizedBlock quantize_block(const float* src, int8_t* q) {
  float amax = 0.f;
  for (int64_t j = 0; j < QK; ++j) {
    // No library calls here: they were most of a step's quantizing. GCC did not inline
    // <cmath>'s std:: wrappers (std::fabs, std::fmax, std::rint) under the optimize pragma
    // this code was once built with, so the rounding below is the builtin (roundss from SSE4.1).
    const float a = src[j] < 0.f ? -src[j] : src[j];
    amax = a > amax ? a : amax;
  }
  QuantizedBlock out;
  out.d = amax * INV127;
  const float id = out.d > 0.f ? 1.f / out.d : 0.f;
  out.halves[0] = out.halves[1] = 0;
  for (int64_t j = 0; j < QK; ++j) {
    q[j] = static_cast<int8_t>(__builtin_rintf(src[j] * id));
    out.halves[j / (QK / 2)] += q[j];
  }
  out.sum = out.d * static_cast<float>(out.halves[0] + out.halves[1]);
  return out;
}

// Block b's 32 weights as the integers they stand for (Q4_0's q - 8, Q6_K's q - 32,
// MXFP4's levels).
template <int64_t F>
inline void decode_block(const uint8_t* row, int64_t b, int8_t* wq) {
  const uint8_t* g = group_of<F>(row, b);
  if constexpr (F == GGML_Q8_0) {
    std::memcpy(wq, g + 2, QK);
  } else if constexpr (F == GGML_Q4_K) {
    const int64_t j = b % 8;
    const uint8_t* qs = g + 16 + j / 2 * 32;
    for (int64_t l = 0; l < QK; ++l) wq[l] = static_cast<int8_t>((qs[l] >> (4 * (j % 2))) & 0x0f);
  } else if constexpr (F == GGML_Q6_K) {
    const int64_t j = b % 8, half = j / 4, k = j % 4;
    const uint8_t* ql = g + half * 64 + (k % 2) * 32;
    const uint8_t* qh = g + 128 + half * 32;
    for (int64_t l = 0; l < QK; ++l) {
      const int q = ((ql[l] >> (4 * (k / 2))) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4);
      wq[l] = static_cast<int8_t>(q - 32);
    }
  } else if constexpr (F == GGML_MXFP4) {
    for (int64_t j = 0; j < QK / 2; ++j) {
      wq[j] = static_cast<int8_t>(MXFP4_BIASED[g[1 + j] & 0x0f] - MXFP4_BIAS);
      wq[j + QK / 2] = static_cast<int8_t>(MXFP4_BIASED[g[1 + j] >> 4] - MXFP4_BIAS);
    }
  } else {
    const uint8_t* qs = g + (F == GGML_Q4_1 ? 4 : 2);
    const int bias = F == GGML_Q4_0 ? 8 : 0;
    for (int64_t j = 0; j < QK / 2; ++j) {
      wq[j] = static_cast<int8_t>((qs[j] & 0x0f) - bias);
      wq[j + QK / 2] = static_cast<int8_t>((qs[j] >> 4) - bias);
    }
  }
}

template <int64_t F>
void matmul_rows(const uint8_t* w, int64_t row_bytes, const XBlocks& xq, float* y,
                 int64_t M, int64_t N, int64_t nb, int64_t n0, int64_t n1) {
  const int8_t* qx = xq.q;
  const float* dx = xq.d;
  const float* sx = xq.sum;
  const int64_t K = nb * QK;
  constexpr int SEGMENTS = F == GGML_Q6_K ? 2 : 1;  // Q6_K: a scale per 16 weights
  constexpr int64_t WIDTH = QK / SEGMENTS;
  int8_t wq[QK];
  std::vector<BlockScales> scales(nb);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    decode_row_scales<F>(row, nb, scales.data());
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.f, offset = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        decode_block<F>(row, b, wq);
        const int8_t* xb = qx + m * K + b * QK;
        for (int h = 0; h < SEGMENTS; ++h) {
          int32_t dot = 0;
          for (int64_t j = h * WIDTH; j < (h + 1) * WIDTH; ++j)
            dot += static_cast<int32_t>(wq[j]) * xb[j];
          const float scale = (h == 0 ? scales[b].lo : scales[b].hi) * dx[b * M + m];
          acc = acc + static_cast<float>(dot) * scale;
        }
        if constexpr (HAS_OFFSET<F>) offset = offset + scales[b].m * sx[b * M + m];
      }
      y[m * N + n] = HAS_OFFSET<F> ? acc + offset : acc;
    }
  }
}

// quant_matmul over quant_pack's layout, which this path never makes.
at::Tensor packed_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t format) {
  (void)x, (void)format;
  TORCH_CHECK(false, "this build reads no packed weights (quant_pack returned the rows)");
  return packed;
}

// quant_pack's layout: none here.
at::Tensor pack_weight(at::Tensor weight, int64_t format) {
  (void)format;
  return weight;  // the portable path reads the rows one at a time: nothing to gain
}

// The path's name (quant_matmul_path).
constexpr const char* kQuantMatmulPath = "portable";

}  // namespace

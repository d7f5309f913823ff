// y = x W^T with W kept in GGUF's blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), never dequantized.
//
// Why integer dot products: a decode step reads every weight once, so a 4.5-bit weight
// reads 7x fewer bytes than float32, and at office batch sizes (16-32 rows) the step is also
// compute-bound, where one AVX2 vpmaddubsw does 32 multiply-adds (an fp32 FMA: 8). The rows
// of x are therefore quantized first, per 32-value block, to int8 with one float scale
// (d = max|x| / 127, q = round(x / d)), as llama.cpp does; each (weight block, x block) pair
// is then an exact integer dot times the two scales. The unsigned formats' offset term (Q4_1,
// Q4_K) uses the block's float sum of x.
//
// Every format is read as 32-weight blocks (kernels/quant_reference.py's header has the
// layouts): a K-quant's 256 weights are eight such blocks whose scales d * sc are exact in
// float32, so its scale is one float per lane of four weights (Q6_K's 16-weight halves are
// lanes 0-3 and 4-7) and no format needs a path of its own past the decoding.
//
// Every float operation happens in one fixed order, the same on every path, and
// kernels/quant_reference.py performs the same operations in torch: the results are equal
// bit for bit, so greedy output over blocks equals the reference's token for token. The
// order: each block's dot is split into 8 lanes (lane l: weights 4l..4l+3, the layout of
// vpdpbusd and of vpmaddubsw + vpmaddwd); lane l accumulates acc += dot_l * (d_w,l * d_x)
// over the blocks, rounding after each product and sum (no fused multiply-add); y is the
// lanes' tree sum ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)); Q4_1/Q4_K then add the offset term,
// sum over blocks, in block order, of m * sum(x block), each block's sum taken in element
// order. This file is compiled without -ffast-math's reassociation (the pragma below).
//
// Paths, chosen when the module is built (kernels/cpu_kernels.py builds one module per CPU
// level and loads the one this CPU's flags, after OFFICELLM_CPU_ISA, allow): AVX-512 VNNI
// (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd) and portable C++.

#include <torch/extension.h>

#include <ATen/Parallel.h>

// The sums' order is the contract with the reference (above): no reassociation, no
// reciprocal approximations, no contraction into fused multiply-adds, whatever flags the
// other kernels are built with.
#pragma GCC optimize("no-fast-math", "fp-contract=off")

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

// Weights per stored group: one block, or a K-quant's 256 (eight blocks).
constexpr int64_t group_weights(int64_t format) {
  return format == GGML_Q4_K || format == GGML_Q6_K ? 256
         : format == GGML_Q4_0 || format == GGML_Q4_1 || format == GGML_Q8_0 ? 32 : 0;
}

constexpr int64_t group_bytes(int64_t format) {
  switch (format) {
    case GGML_Q4_0: return 18;   // fp16 d, 16 bytes of nibbles
    case GGML_Q4_1: return 20;   // fp16 d, fp16 m, 16 bytes of nibbles
    case GGML_Q8_0: return 34;   // fp16 d, 32 int8
    case GGML_Q4_K: return 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit pairs, 128 of nibbles
    case GGML_Q6_K: return 210;  // 128 bytes low nibbles, 64 high bit pairs, 16 int8, fp16 d
    default: return 0;
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

float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(OFFICELLM_QMM_AVX2)
  return _cvtsh_ss(h);
#else
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
#endif
}

// x quantized per block: int8 values, the block's scale, its exact float sum (Q4_1's offset).
// Scales and sums are block-major ([nb, M], eight floats of padding) so a tile reads its x
// rows' values of one block as one vector.
struct QuantizedRows {
  torch::Tensor q;    // int8 [M, K]
  torch::Tensor d;    // float [nb * M + 8]: block b's scale of row m at b * M + m
  torch::Tensor sum;  // float [nb * M + 8], as d
};

QuantizedRows quantize_rows(const torch::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  QuantizedRows out{torch::empty({M, K}, x.options().dtype(torch::kInt8)),
                    torch::zeros({nb * M + 8}, x.options()),
                    torch::zeros({nb * M + 8}, x.options())};
  const float* xp = x.data_ptr<float>();
  int8_t* qp = out.q.data_ptr<int8_t>();
  float* dp = out.d.data_ptr<float>();
  float* sp = out.sum.data_ptr<float>();
  at::parallel_for(0, M * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* src = xp + i * QK;  // rows are contiguous: block i of the flat [M * nb]
      float amax = 0.f, sum = 0.f;
      for (int64_t j = 0; j < QK; ++j) {
        amax = std::fmax(amax, std::fabs(src[j]));
        sum = sum + src[j];  // element order (the contract)
      }
      const float d = amax * INV127;
      const float id = d > 0.f ? 1.f / d : 0.f;
      for (int64_t j = 0; j < QK; ++j) qp[i * QK + j] = static_cast<int8_t>(std::nearbyint(src[j] * id));
      const int64_t at = i % nb * M + i / nb;
      dp[at] = d;
      sp[at] = sum;
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
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* g = row + b * group_bytes(F);
      BlockScales& o = out[b];
      o.lo = o.hi = half_to_float(g);
      o.m = F == GGML_Q4_1 ? half_to_float(g + 2) : 0.f;
    }
  }
}

#if defined(OFFICELLM_QMM_AVX2)

inline __m256i shift_right_16(__m256i v, int64_t count) {
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(static_cast<int>(count)));
}

// Block b's 32 weights as bytes (unsigned for Q4_1 and Q4_K, signed for the others).
template <int64_t F>
inline __m256i load_weights(const uint8_t* row, int64_t b) {
  const uint8_t* g = group_of<F>(row, b);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  if constexpr (F == GGML_Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 2));
  } else if constexpr (F == GGML_Q4_K) {
    const int64_t j = b % 8;  // nibbles: low (j even) or high halves of 32 bytes
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16 + j / 2 * 32));
    return _mm256_and_si256(shift_right_16(raw, 4 * (j % 2)), nibble);
  } else if constexpr (F == GGML_Q6_K) {
    const int64_t j = b % 8, half = j / 4, k = j % 4;
    const __m256i ql = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(g + half * 64 + (k % 2) * 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 128 + half * 32));
    const __m256i lo = _mm256_and_si256(shift_right_16(ql, 4 * (k / 2)), nibble);
    const __m256i hi = _mm256_and_si256(shift_right_16(qh, 2 * k), _mm256_set1_epi8(3));
    const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..63, no carry
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
  } else {
    const uint8_t* qs = g + (F == GGML_Q4_1 ? 4 : 2);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, mask);                     // weights 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);  // weights 16..31
    __m256i w = _mm256_set_m128i(hi, lo);
    if constexpr (F == GGML_Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    return w;
  }
}

// Eight int32 partial sums of u * s over 32 byte pairs (u unsigned, s signed).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(OFFICELLM_QMM_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  // Pairs of products fit int16: |u| <= 128, |s| <= 127 (no saturation).
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

template <int64_t F>
inline __m256i block_dot(__m256i w, __m256i xq) {
  if constexpr (HAS_OFFSET<F>) {
    return dot_u8s8(w, xq);
  } else {  // signed weights: |w| as the unsigned operand, w's sign moved onto x
    return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One NR x MR tile of y: NR weight rows against MR rows of x, every accumulator in a
// register (the sizes are compile-time, so the loops unroll): each decoded weight block
// serves MR x blocks and each x block NR weight rows. A pair's scale d_w * d_x is made for all
// the tile's x rows at once (one vector product per weight row) and read back as a broadcast load,
// which takes a load port instead of the multiply ports the dots keep busy.
template <int64_t F, int NR, int MR>
inline void tile(const uint8_t* w, int64_t row_bytes, const BlockScales* scales,
                 const int8_t* qx, const float* dx, const float* sx, float* y, int64_t M,
                 int64_t N, int64_t nb, int64_t n, int64_t m) {
  static_assert(MR <= 8, "a tile's x rows share one vector of scales");
  constexpr bool SPLIT = F == GGML_Q6_K;  // lanes 0-3 and 4-7 scaled apart
  const int64_t K = nb * QK;
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int r = 0; r < MR; ++r) acc[i][r] = _mm256_setzero_ps();
  alignas(32) float lo[NR][8], hi[SPLIT ? NR : 1][8];
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[MR];
    for (int r = 0; r < MR; ++r)
      xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + (m + r) * K + b * QK));
    const __m256 dx8 = _mm256_loadu_ps(dx + b * M + m);  // past MR: padding or the next block
    for (int i = 0; i < NR && (MR > 1 || SPLIT); ++i) {
      const BlockScales& bs = scales[i * nb + b];
      _mm256_store_ps(lo[i], _mm256_mul_ps(_mm256_set1_ps(bs.lo), dx8));
      if constexpr (SPLIT) _mm256_store_ps(hi[i], _mm256_mul_ps(_mm256_set1_ps(bs.hi), dx8));
    }
    for (int i = 0; i < NR; ++i) {
      const __m256i wv = load_weights<F>(w + (n + i) * row_bytes, b);
      for (int r = 0; r < MR; ++r) {
        const __m256 scale = SPLIT ? _mm256_set_m128(_mm_broadcast_ss(&hi[SPLIT ? i : 0][r]),
                                                     _mm_broadcast_ss(&lo[i][r]))
                             : MR == 1 ? _mm256_mul_ps(_mm256_set1_ps(scales[i * nb + b].lo),
                                                       _mm256_set1_ps(dx[b * M + m]))
                                       : _mm256_broadcast_ss(&lo[i][r]);
        const __m256 dot = _mm256_cvtepi32_ps(block_dot<F>(wv, xv[r]));
        acc[i][r] = _mm256_add_ps(acc[i][r], _mm256_mul_ps(dot, scale));
      }
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int r = 0; r < MR; ++r) y[(m + r) * N + n + i] = hsum(acc[i][r]);
  if constexpr (HAS_OFFSET<F>) {
    // The offsets' term, sum_b m_b * sum(x block b), in its own pass (inside the loop above
    // it took the registers the accumulators need): each lane one x row, in block order.
    for (int i = 0; i < NR; ++i) {
      const BlockScales* row = scales + i * nb;
      __m256 off = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b)
        off = _mm256_add_ps(off, _mm256_mul_ps(_mm256_set1_ps(row[b].m),
                                               _mm256_loadu_ps(sx + b * M + m)));
      alignas(32) float o[8];
      _mm256_store_ps(o, off);
      for (int r = 0; r < MR; ++r) y[(m + r) * N + n + i] += o[r];
    }
  }
}

// Tile sizes: AVX-512 has 32 vector registers (16 accumulators fit), AVX2 16 (8 fit).
#if defined(OFFICELLM_QMM_VNNI)
constexpr int TILE_N = 4;
#else
constexpr int TILE_N = 2;
#endif
constexpr int TILE_M = 4;

// Weight rows [n, n + NR) against every row of x: their scales decoded once, then tiles.
template <int64_t F, int NR>
inline void tile_rows(const uint8_t* w, int64_t row_bytes, BlockScales* scales,
                      const int8_t* qx, const float* dx, const float* sx, float* y, int64_t M,
                      int64_t N, int64_t nb, int64_t n) {
  for (int i = 0; i < NR; ++i) decode_row_scales<F>(w + (n + i) * row_bytes, nb, scales + i * nb);
  // One x row (a lone user's decode) is bound by reading weights: all NR rows in one tile.
  if (M == 1) {
    tile<F, NR, 1>(w, row_bytes, scales, qx, dx, sx, y, M, N, nb, n, 0);
    return;
  }
  int64_t m = 0;
  for (; m + TILE_M <= M; m += TILE_M)
    tile<F, NR, TILE_M>(w, row_bytes, scales, qx, dx, sx, y, M, N, nb, n, m);
  switch (M - m) {
    case 3: tile<F, NR, 3>(w, row_bytes, scales, qx, dx, sx, y, M, N, nb, n, m); break;
    case 2: tile<F, NR, 2>(w, row_bytes, scales, qx, dx, sx, y, M, N, nb, n, m); break;
    case 1: tile<F, NR, 1>(w, row_bytes, scales, qx, dx, sx, y, M, N, nb, n, m); break;
    default: break;
  }
}

// Rows [n0, n1) of y for all M rows of x.
template <int64_t F>
void matmul_rows(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, float* y,
                 int64_t M, int64_t N, int64_t nb, int64_t n0, int64_t n1) {
  const int8_t* qx = xq.q.data_ptr<int8_t>();
  const float* dx = xq.d.data_ptr<float>();
  const float* sx = xq.sum.data_ptr<float>();
  std::vector<BlockScales> scales(2 * TILE_N * nb);
  BlockScales* sp = scales.data();
  int64_t n = n0;
  // One x row (a lone user's decode) is bound by reading weights: more rows per tile.
  if (M == 1)
    for (; n + 2 * TILE_N <= n1; n += 2 * TILE_N)
      tile_rows<F, 2 * TILE_N>(w, row_bytes, sp, qx, dx, sx, y, M, N, nb, n);
  for (; n + TILE_N <= n1; n += TILE_N)
    tile_rows<F, TILE_N>(w, row_bytes, sp, qx, dx, sx, y, M, N, nb, n);
  for (; n < n1; ++n) tile_rows<F, 1>(w, row_bytes, sp, qx, dx, sx, y, M, N, nb, n);
}

#else  // portable C++: the same lanes and order as the vector paths

// Block b's 32 weights as small integers (the vector path's bytes).
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
void matmul_rows(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, float* y,
                 int64_t M, int64_t N, int64_t nb, int64_t n0, int64_t n1) {
  const int8_t* qx = xq.q.data_ptr<int8_t>();
  const float* dx = xq.d.data_ptr<float>();
  const float* sx = xq.sum.data_ptr<float>();
  const int64_t K = nb * QK;
  int8_t wq[QK];
  std::vector<BlockScales> scales(nb);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    decode_row_scales<F>(row, nb, scales.data());
    for (int64_t m = 0; m < M; ++m) {
      float acc[8] = {};
      float offset = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const BlockScales& bs = scales[b];
        decode_block<F>(row, b, wq);
        const int8_t* xb = qx + m * K + b * QK;
        const float scale_lo = bs.lo * dx[b * M + m], scale_hi = bs.hi * dx[b * M + m];
        for (int l = 0; l < 8; ++l) {
          int32_t dot = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) dot += static_cast<int32_t>(wq[j]) * xb[j];
          acc[l] = acc[l] + static_cast<float>(dot) * (l < 4 ? scale_lo : scale_hi);
        }
        if constexpr (HAS_OFFSET<F>) offset = offset + bs.m * sx[b * M + m];
      }
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6],
                  h3 = acc[3] + acc[7];
      y[m * N + n] = ((h0 + h2) + (h1 + h3)) + offset;
    }
  }
}

#endif

template <int64_t F>
void run(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, float* y, int64_t M,
         int64_t N, int64_t nb) {
  // Tasks of whole 8-row groups, so every task but the last runs full tiles.
  constexpr int64_t G = 8;
  at::parallel_for(0, (N + G - 1) / G, 4, [&](int64_t begin, int64_t end) {
    matmul_rows<F>(w, row_bytes, xq, y, M, N, nb, begin * G, std::min(N, end * G));
  });
}

}  // namespace

// x [M, K] float32 (contiguous rows); weight: uint8 [N, K / group weights * group bytes]
// of `format` groups (a GGUF tensor's rows). Returns float32 [M, N].
torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor weight, int64_t format) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be float32 [M, K]");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kUInt8 && weight.is_contiguous(),
              "weight must be contiguous uint8 [N, row bytes]");
  const int64_t gw = group_weights(format);
  TORCH_CHECK(gw > 0, "no kernel for GGUF type ", format);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(K % gw == 0, "K must be a multiple of ", gw, " for GGUF type ", format);
  const int64_t nb = K / QK;
  const int64_t row_bytes = K / gw * group_bytes(format);
  TORCH_CHECK(weight.size(1) == row_bytes, "weight rows hold ", weight.size(1),
              " bytes, expected ", row_bytes);
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const QuantizedRows xq = quantize_rows(x.contiguous());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  switch (format) {
    case GGML_Q4_0: run<GGML_Q4_0>(w, row_bytes, xq, yp, M, N, nb); break;
    case GGML_Q4_1: run<GGML_Q4_1>(w, row_bytes, xq, yp, M, N, nb); break;
    case GGML_Q4_K: run<GGML_Q4_K>(w, row_bytes, xq, yp, M, N, nb); break;
    case GGML_Q6_K: run<GGML_Q6_K>(w, row_bytes, xq, yp, M, N, nb); break;
    default: run<GGML_Q8_0>(w, row_bytes, xq, yp, M, N, nb); break;
  }
  return y;
}

// Which of the paths above this module was built with.
std::string quant_matmul_path() {
#if defined(OFFICELLM_QMM_VNNI)
  return "avx512_vnni";
#elif defined(OFFICELLM_QMM_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

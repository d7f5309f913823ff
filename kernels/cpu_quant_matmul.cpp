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
// float32, Q6_K's two 16-weight halves each with its own scale (two "segments" of a block;
// the other formats have one), so no format needs a path of its own past the decoding.
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
// block order, of m * sum(x block), each block's sum in quantize_block's order. This file is
// compiled without -ffast-math's reassociation (the pragma below).
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
#include <type_traits>
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

// x quantized per block: int8 values, the block's scale, its exact float sum (Q4_1's offset)
// and the integer sums of its two halves (Q4_0's and Q6_K's unsigned storage). Scales and
// sums are block-major so a tile's x rows are neighbours.
// Plain buffers, not tensors: a tile reads them through raw pointers (a tensor's data_ptr is
// an out-of-line call with checks, and was being made per tile).
struct QuantizedRows {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> d;       // [nb * M]: block b's scale of row m at b * M + m
  std::vector<float> sum;     // [nb * M], as d
  std::vector<int32_t> isum;  // [2 * nb * M]: half h of block b of row m at (2b + h) * M + m
};

// One 32-value block of x quantized: its int8 values, scale d, float sum and the integer
// sums of its two halves. The float sum's order (the contract with the reference): the four
// 8-value runs added lane by lane, ((r0 + r1) + r2) + r3, then the eight lanes folded in
// halves, l + l[4:], then l + l[2:], then l[0] + l[1], the order one vector's adds give.
struct QuantizedBlock {
  float d, sum;
  int32_t halves[2];
};

#if defined(OFFICELLM_QMM_AVX2)
inline QuantizedBlock quantize_block(const float* src, int8_t* q) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(src + 8 * i);
  __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude),
                                            _mm256_and_ps(v[1], magnitude)),
                              _mm256_max_ps(_mm256_and_ps(v[2], magnitude),
                                            _mm256_and_ps(v[3], magnitude)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  QuantizedBlock out;
  out.d = _mm_cvtss_f32(m4) * INV127;
  const __m256 id = _mm256_set1_ps(out.d > 0.f ? 1.f / out.d : 0.f);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i)
    qi[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order.
  const __m256i bytes = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  for (int h = 0; h < 2; ++h) {
    const __m256i s8 = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    out.halves[h] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_srli_si128(s4, 4)));
  }
  const __m256 lanes = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), v[2]), v[3]);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  out.sum = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  return out;
}
#else
inline QuantizedBlock quantize_block(const float* src, int8_t* q) {
  float amax = 0.f;
  for (int64_t j = 0; j < QK; ++j) {
    // No library calls here: they were most of a step's quantizing. Under this file's
    // optimize pragma GCC does not inline <cmath>'s std:: wrappers (std::fabs, std::fmax,
    // std::rint), so the rounding below is the builtin (roundss from SSE4.1).
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
  float lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = ((src[l] + src[8 + l]) + src[16 + l]) + src[24 + l];
  for (int l = 0; l < 4; ++l) lanes[l] = lanes[l] + lanes[l + 4];
  for (int l = 0; l < 2; ++l) lanes[l] = lanes[l] + lanes[l + 2];
  out.sum = lanes[0] + lanes[1];
  return out;
}
#endif

QuantizedRows quantize_rows(const torch::Tensor& x) {
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
// q - 8 is summed as q, less 8 times the block's sum of x; Q6_K's q - 32 likewise per half.
template <int64_t F>
inline int32_t unsigned_correction(const int32_t* isum, int64_t b, int64_t M, int64_t m,
                                   int half) {
  if constexpr (F == GGML_Q4_0) {
    return 8 * (isum[2 * b * M + m] + isum[(2 * b + 1) * M + m]);
  } else if constexpr (F == GGML_Q6_K) {
    return 32 * isum[(2 * b + half) * M + m];
  } else {
    return 0;
  }
}

#if defined(OFFICELLM_QMM_AVX2)

inline __m256i shift_right_16(__m256i v, int64_t count) {
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(static_cast<int>(count)));
}

// out[t], lane l: dword t of the 16 bytes at rows[l] + at (a 4 x 4 transpose per 128 bits).
inline void transpose_8x4(const uint8_t* const* rows, int64_t at, __m256i* out) {
  __m256i r[4];
  for (int l = 0; l < 4; ++l)
    r[l] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[l] + at))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[l + 4] + at)), 1);
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Block b of the eight rows as eight steps: w[s], lane l, holds row l's weights 4s..4s+3 as
// bytes (signed for Q8_0, unsigned for the others).
template <int64_t F>
inline void load_steps(const uint8_t* const* rows, int64_t b, __m256i* w) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const int64_t at = b / (group_weights(F) / QK) * group_bytes(F);
  if constexpr (F == GGML_Q8_0) {
    transpose_8x4(rows, at + 2, w);
    transpose_8x4(rows, at + 18, w + 4);
  } else if constexpr (F == GGML_Q4_0 || F == GGML_Q4_1) {
    // Byte j's low nibble is weight j, its high nibble weight j + 16: dword t gives steps t
    // and t + 4.
    __m256i v[4];
    transpose_8x4(rows, at + (F == GGML_Q4_1 ? 4 : 2), v);
    for (int t = 0; t < 4; ++t) {
      w[t] = _mm256_and_si256(v[t], nibble);
      w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v[t], 4), nibble);
    }
  } else if constexpr (F == GGML_Q4_K) {
    const int64_t j = b % 8;  // nibbles: low (j even) or high halves of 32 bytes
    const int64_t q = at + 16 + j / 2 * 32;
    transpose_8x4(rows, q, w);
    transpose_8x4(rows, q + 16, w + 4);
    for (int s = 0; s < 8; ++s) w[s] = _mm256_and_si256(shift_right_16(w[s], 4 * (j % 2)), nibble);
  } else {  // Q6_K: q (0..63) from a nibble and a bit pair; its -32 is the correction's
    const int64_t j = b % 8, half = j / 4, k = j % 4;
    const int64_t l_at = at + half * 64 + (k % 2) * 32, h_at = at + 128 + half * 32;
    __m256i ql[8], qh[8];
    transpose_8x4(rows, l_at, ql);
    transpose_8x4(rows, l_at + 16, ql + 4);
    transpose_8x4(rows, h_at, qh);
    transpose_8x4(rows, h_at + 16, qh + 4);
    for (int s = 0; s < 8; ++s) {
      const __m256i lo = _mm256_and_si256(shift_right_16(ql[s], 4 * (k / 2)), nibble);
      const __m256i hi = _mm256_and_si256(shift_right_16(qh[s], 2 * k), _mm256_set1_epi8(3));
      w[s] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // no carry across bytes
    }
  }
}

// Step s of an x block (its weights 4s..4s+3) in every lane.
inline __m256i x_step(const int8_t* xb, int s) {
  int32_t v;
  std::memcpy(&v, xb + 4 * s, 4);
  return _mm256_set1_epi32(v);
}

// Lane l of lo[r] (and of hi[r], Q6_K's second half): the exact integer dot of weight row
// l's block with x row r's, the unsigned formats' q taken as stored.
template <int64_t F, int MR>
inline void block_dots(const __m256i* w, const int8_t* const* xb, __m256i* lo, __m256i* hi) {
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
#if defined(OFFICELLM_QMM_VNNI)
  // vpdpbusd accumulates in place (5 cycles each): few x rows need parallel chains.
  constexpr int CHAINS = MR >= 4 ? 1 : MR >= 2 ? 2 : 4;
  constexpr int SEGMENT_STEPS = F == GGML_Q6_K ? 4 : 8;
  for (int s0 = 0; s0 < 8; s0 += SEGMENT_STEPS) {
    __m256i a[CHAINS][MR];
    for (int c = 0; c < CHAINS; ++c)
      for (int r = 0; r < MR; ++r) a[c][r] = _mm256_setzero_si256();
    for (int s = s0; s < s0 + SEGMENT_STEPS; ++s) {
      if constexpr (F == GGML_Q8_0) {  // |w| as the unsigned operand, w's sign moved onto x
        const __m256i u = _mm256_abs_epi8(w[s]);
        for (int r = 0; r < MR; ++r)
          a[s % CHAINS][r] = _mm256_dpbusd_epi32(a[s % CHAINS][r], u,
                                                 _mm256_sign_epi8(x_step(xb[r], s), w[s]));
      } else {
        for (int r = 0; r < MR; ++r)
          a[s % CHAINS][r] = _mm256_dpbusd_epi32(a[s % CHAINS][r], w[s], x_step(xb[r], s));
      }
    }
    for (int r = 0; r < MR; ++r) {
      __m256i sum = a[0][r];
      for (int c = 1; c < CHAINS; ++c) sum = _mm256_add_epi32(sum, a[c][r]);
      (s0 == 0 ? lo : hi)[r] = sum;
    }
  }
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (F == GGML_Q8_0) {
    // A pair of products reaches 2 * 128 * 127: widened to int32 every step.
    for (int s = 0; s < 8; ++s) {
      const __m256i a = _mm256_abs_epi8(w[s]);
      for (int r = 0; r < MR; ++r) {
        const __m256i p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(x_step(xb[r], s), w[s]));
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(p, ones));
      }
    }
  } else if constexpr (F == GGML_Q6_K) {
    // 6-bit q: two steps' pairs (2 * 2 * 63 * 127) fit int16, then widened.
    for (int s = 0; s < 8; s += 2) {
      for (int r = 0; r < MR; ++r) {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w[s], x_step(xb[r], s)),
                                           _mm256_maddubs_epi16(w[s + 1], x_step(xb[r], s + 1)));
        __m256i& acc = s >= 4 ? hi[r] : lo[r];
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
      }
    }
  } else {
    // 4-bit q: all eight steps' pairs (8 * 2 * 15 * 127) fit int16, widened once.
    __m256i a[MR];
    for (int r = 0; r < MR; ++r) a[r] = _mm256_maddubs_epi16(w[0], x_step(xb[r], 0));
    for (int s = 1; s < 8; ++s)
      for (int r = 0; r < MR; ++r)
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(w[s], x_step(xb[r], s)));
    for (int r = 0; r < MR; ++r) lo[r] = _mm256_madd_epi16(a[r], ones);
  }
#endif
}

// acc += float(dot - correction) * (d_w * d_x): one segment's term for eight weight rows.
inline __m256 add_term(__m256 acc, __m256i dot, int32_t correction, __m256 dw, float dx) {
  const __m256i exact = _mm256_sub_epi32(dot, _mm256_set1_epi32(correction));
  const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(exact), scale));
}

inline __m256 add_term(__m256 acc, __m256i dot, int32_t correction, const float* dw, float dx) {
  return add_term(acc, dot, correction, _mm256_loadu_ps(dw), dx);
}

// acc[r] += the sum over blocks, in block order, of m_b * sum(x row r's block b): each
// block's offsets (offsets(b), eight weight rows' m) read once for all MR rows, whose MR
// sums run side by side (one row's sum alone is a chain of dependent adds, and was a fifth
// of a 64-row tile's time). sx: the rows' block sums, block b's at sx[b * M + r].
template <int MR, typename Offsets>
inline void add_offsets(__m256* acc, Offsets&& offsets, const float* sx, int64_t M, int64_t nb) {
  __m256 off[MR];
  for (int r = 0; r < MR; ++r) off[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256 mw = offsets(b);
    for (int r = 0; r < MR; ++r)
      off[r] = _mm256_add_ps(off[r], _mm256_mul_ps(mw, _mm256_set1_ps(sx[b * M + r])));
  }
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_add_ps(acc[r], off[r]);
}

// Eight weight rows (one group, lanes) against x rows [m, m + MR): y's MR x 8 results.
template <int64_t F, int MR>
inline void tile(const uint8_t* const* rows, const GroupScales& gs, const QuantizedRows& xq,
                 float* y, int64_t M, int64_t N, int64_t nb, int64_t n, int64_t valid,
                 int64_t m) {
  const int64_t K = nb * QK;
  const int8_t* qx = xq.q.data();
  const float* dx = xq.d.data();
  const int32_t* isum = xq.isum.data();
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[8], lo[MR], hi[MR];
    load_steps<F>(rows, b, w);
    const int8_t* xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = qx + (m + r) * K + b * QK;
    block_dots<F, MR>(w, xb, lo, hi);
    for (int r = 0; r < MR; ++r) {
      const float d = dx[b * M + m + r];
      acc[r] = add_term(acc[r], lo[r], unsigned_correction<F>(isum, b, M, m + r, 0),
                        gs.lo.data() + b * 8, d);
      if constexpr (F == GGML_Q6_K)
        acc[r] = add_term(acc[r], hi[r], unsigned_correction<F>(isum, b, M, m + r, 1),
                          gs.hi.data() + b * 8, d);
    }
  }
  if constexpr (HAS_OFFSET<F>) {
    // The offsets' term, sum over blocks of m * sum(x block), in block order.
    add_offsets<MR>(acc, [&](int64_t b) { return _mm256_loadu_ps(gs.m.data() + b * 8); },
                    xq.sum.data() + m, M, nb);
  }
  for (int r = 0; r < MR; ++r) {
    float* out = y + (m + r) * N + n;
    if (valid == 8) {
      _mm256_storeu_ps(out, acc[r]);
    } else {
      alignas(32) float v[8];
      _mm256_store_ps(v, acc[r]);
      std::memcpy(out, v, valid * sizeof(float));
    }
  }
}

#if defined(OFFICELLM_QMM_VNNI)
constexpr int TILE_M = 8;  // 32 vector registers
#else
constexpr int TILE_M = 4;
#endif

// Calls tile(MR, m) for x rows [m, m + MR) covering [0, M): full tiles, then one short one
// (MR a compile-time constant, so each tile's accumulators stay in registers).
template <typename Tile>
inline void over_tiles(int64_t M, Tile&& tile) {
  int64_t m = 0;
  for (; m + TILE_M <= M; m += TILE_M) tile(std::integral_constant<int, TILE_M>{}, m);
  switch (M - m) {
#if defined(OFFICELLM_QMM_VNNI)
    case 7: tile(std::integral_constant<int, 7>{}, m); break;
    case 6: tile(std::integral_constant<int, 6>{}, m); break;
    case 5: tile(std::integral_constant<int, 5>{}, m); break;
    case 4: tile(std::integral_constant<int, 4>{}, m); break;
#endif
    case 3: tile(std::integral_constant<int, 3>{}, m); break;
    case 2: tile(std::integral_constant<int, 2>{}, m); break;
    case 1: tile(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

// Rows [n0, n1) of y for all M rows of x, eight weight rows at a time.
template <int64_t F>
void matmul_rows(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, float* y,
                 int64_t M, int64_t N, int64_t nb, int64_t n0, int64_t n1) {
  GroupScales gs(nb);
  std::vector<BlockScales> row_scales(nb);
  for (int64_t n = n0; n < n1; n += 8) {
    const int64_t valid = std::min<int64_t>(8, n1 - n);
    const uint8_t* rows[8];  // a short last group repeats its last row (results dropped)
    for (int l = 0; l < 8; ++l) rows[l] = w + (n + std::min<int64_t>(l, valid - 1)) * row_bytes;
    gs.decode<F>(rows, nb, row_scales);
    over_tiles(M, [&](auto mr, int64_t m) {
      tile<F, decltype(mr)::value>(rows, gs, xq, y, M, N, nb, n, valid, m);
    });
  }
}

// The packed layout (quant_pack): a group of eight weight rows stored block by block, each
// block as its eight rows' scales (then the offsets of Q4_1 and Q4_K, or Q6_K's second-half
// scales) and its quants already in the lanes the vectors read: 8-bit quants (Q8_0, and
// Q6_K's 0..63) as eight step vectors, 4-bit ones as four vectors of nibble pairs (t and
// t + 4). A 32-weight format keeps its fp16 scales and its bytes, in another order. A
// K-quant keeps the float32 scales decode_row_scales gives (d * sc, and Q4_K's -dmin * mn)
// and its quants re-laid as the 32-weight formats' (Q4_K's nibbles paired as Q4_1's, Q6_K's
// six bits one byte each). A block then costs a few loads instead of four 8 x 4 transposes
// and 16 scalar scale conversions (a K-quant's: its 6-bit scales unpacked and its bit planes
// joined, per block and tile), at one row of x (a user typing), where the kernel had been
// bound by that work rather than by the bytes read, and at a few rows, where it decided
// whether blocks beat the dense weight at all. The K-quants' blocks grow (Q4_K 144 -> 192 B
// per 8 x 32 weights, Q6_K 210 -> 320), which one row of x pays in bytes read.
template <int64_t F>
constexpr bool K_QUANT = F == GGML_Q4_K || F == GGML_Q6_K;

// 8-bit quants in the packed block (Q8_0's int8, Q6_K's unsigned six bits); else nibbles.
template <int64_t F>
constexpr bool BYTE_QUANTS = F == GGML_Q8_0 || F == GGML_Q6_K;

template <int64_t F>
constexpr int64_t packed_scale_bytes() {
  return K_QUANT<F> ? 64 : F == GGML_Q4_1 ? 32 : 16;
}

template <int64_t F>
constexpr int64_t packed_block_bytes() {
  return packed_scale_bytes<F>() + (BYTE_QUANTS<F> ? 256 : 128);
}

constexpr int64_t packed_block_bytes(int64_t format) {
  switch (format) {
    case GGML_Q4_0: return packed_block_bytes<GGML_Q4_0>();
    case GGML_Q4_1: return packed_block_bytes<GGML_Q4_1>();
    case GGML_Q8_0: return packed_block_bytes<GGML_Q8_0>();
    case GGML_Q4_K: return packed_block_bytes<GGML_Q4_K>();
    case GGML_Q6_K: return packed_block_bytes<GGML_Q6_K>();
    default: return 0;
  }
}

// A K-quant block's 32 quants as stored, unsigned (Q4_K 0..15, Q6_K 0..63).
template <int64_t F>
void k_quant_block(const uint8_t* row, int64_t b, uint8_t* q) {
  const uint8_t* g = group_of<F>(row, b);
  const int64_t j = b % 8;
  if constexpr (F == GGML_Q4_K) {
    const uint8_t* qs = g + 16 + j / 2 * 32;
    for (int64_t l = 0; l < QK; ++l) q[l] = (qs[l] >> (4 * (j % 2))) & 0x0f;
  } else {
    const int64_t half = j / 4, k = j % 4;
    const uint8_t* ql = g + half * 64 + (k % 2) * 32;
    const uint8_t* qh = g + 128 + half * 32;
    for (int64_t l = 0; l < QK; ++l)
      q[l] = static_cast<uint8_t>(((ql[l] >> (4 * (k / 2))) & 0x0f) |
                                  (((qh[l] >> (2 * k)) & 3) << 4));
  }
}

// A K-quant group of eight rows into the packed layout, lane by lane (load time only).
template <int64_t F>
void pack_k_quant_group(const uint8_t* const* rows, int64_t nb, uint8_t* out,
                        std::vector<BlockScales>& row_scales) {
  constexpr int64_t PB = packed_block_bytes<F>();
  constexpr int64_t SB = packed_scale_bytes<F>();
  for (int l = 0; l < 8; ++l) {
    decode_row_scales<F>(rows[l], nb, row_scales.data());
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + b * PB;
      const BlockScales& sc = row_scales[b];
      const float second = F == GGML_Q4_K ? sc.m : sc.hi;
      std::memcpy(blk + 4 * l, &sc.lo, 4);
      std::memcpy(blk + 32 + 4 * l, &second, 4);
      uint8_t q[QK];
      k_quant_block<F>(rows[l], b, q);
      // Vector t, lane l: four quant bytes; 8-bit: weights 4t..4t+3; nibbles: byte j holds
      // weight j low and weight j + 16 high, as Q4_1 stores them.
      for (int64_t j = 0; j < (BYTE_QUANTS<F> ? QK : QK / 2); ++j) {
        blk[SB + 32 * (j / 4) + 4 * l + j % 4] =
            BYTE_QUANTS<F> ? q[j] : static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
      }
    }
  }
}

template <int64_t F>
void pack_groups(const uint8_t* w, int64_t row_bytes, int64_t nb, uint8_t* out, int64_t groups) {
  constexpr int64_t PB = packed_block_bytes<F>();
  at::parallel_for(0, groups, 16, [&](int64_t begin, int64_t end) {
    std::vector<BlockScales> row_scales(nb);
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* rows[8];
      for (int l = 0; l < 8; ++l) rows[l] = w + (8 * g + l) * row_bytes;
      if constexpr (K_QUANT<F>) {
        pack_k_quant_group<F>(rows, nb, out + g * nb * PB, row_scales);
      } else {
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* blk = out + (g * nb + b) * PB;
          const int64_t at = b * group_bytes(F);
          for (int l = 0; l < 8; ++l) {
            std::memcpy(blk + 2 * l, rows[l] + at, 2);  // d
            if constexpr (F == GGML_Q4_1) std::memcpy(blk + 16 + 2 * l, rows[l] + at + 2, 2);
          }
          __m256i v[8];
          constexpr int VECTORS = F == GGML_Q8_0 ? 8 : 4;
          if constexpr (F == GGML_Q8_0) {
            transpose_8x4(rows, at + 2, v);
            transpose_8x4(rows, at + 18, v + 4);
          } else {
            transpose_8x4(rows, at + (F == GGML_Q4_1 ? 4 : 2), v);
          }
          for (int t = 0; t < VECTORS; ++t)
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(blk + packed_scale_bytes<F>() + 32 * t), v[t]);
        }
      }
    }
  });
}

// A packed block's eight steps, as load_steps gives them from the rows.
template <int64_t F>
inline void load_packed_steps(const uint8_t* blk, __m256i* w) {
  const uint8_t* q = blk + packed_scale_bytes<F>();
  if constexpr (BYTE_QUANTS<F>) {
    for (int s = 0; s < 8; ++s) w[s] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * s));
  } else {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < 4; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * t));
      w[t] = _mm256_and_si256(v, nibble);
      w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    }
  }
}

#if !defined(OFFICELLM_QMM_VNNI)
// The 4-bit formats' block_dots on AVX2, straight from a packed block: each 32-byte load is
// split into its two steps (t, t + 4) and used at once by every x row, so only two weight
// vectors are live instead of eight (with all eight, GCC computed the tile's 32 products
// first and spilled them to the stack).
template <int MR>
inline void packed_nibble_dots(const uint8_t* q, const int8_t* const* xb, __m256i* lo) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  __m256i a[MR];
  for (int r = 0; r < MR; ++r) a[r] = _mm256_setzero_si256();
  // Kept a loop: unrolled, GCC reassociates the integer sums into a tree and computes every
  // product first (the spills this function exists to avoid).
#pragma GCC unroll 1
  for (int t = 0; t < 4; ++t) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * t));
    const __m256i wl = _mm256_and_si256(v, nibble);
    const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    for (int r = 0; r < MR; ++r) {
      // 4-bit q: all eight steps' pairs (8 * 2 * 15 * 127) fit int16, widened once.
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wl, x_step(xb[r], t)),
                                         _mm256_maddubs_epi16(wh, x_step(xb[r], t + 4)));
      a[r] = _mm256_add_epi16(a[r], p);
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) lo[r] = _mm256_madd_epi16(a[r], ones);
}

// Q8_0's block_dots on AVX2 from a packed block, one step at a time for the same reason.
template <int MR>
inline void packed_q8_dots(const uint8_t* q, const int8_t* const* xb, __m256i* lo) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) lo[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int s = 0; s < 8; ++s) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * s));
    const __m256i u = _mm256_abs_epi8(w);  // |w| unsigned, w's sign moved onto x
    for (int r = 0; r < MR; ++r) {
      // A pair of products reaches 2 * 128 * 127: widened to int32 every step.
      const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(x_step(xb[r], s), w));
      lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(p, ones));
    }
  }
}

// Q6_K's block_dots on AVX2 from a packed block: steps 0-3 (the first 16 weights) into lo,
// 4-7 into hi, each a pair of steps at a time (2 * 2 * 63 * 127 fits int16), then widened.
template <int MR>
inline void packed_q6_half_dots(const uint8_t* q, const int8_t* const* xb, int s0, __m256i* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int s = s0; s < s0 + 4; s += 2) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * s));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * s + 32));
    for (int r = 0; r < MR; ++r) {
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, x_step(xb[r], s)),
                                         _mm256_maddubs_epi16(w1, x_step(xb[r], s + 1)));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, ones));
    }
  }
}
#endif

// block_dots of a packed block: on AVX2 straight from its loads, step by step (above); with
// VNNI the eight steps are loaded first (its 32 registers hold them).
template <int64_t F, int MR>
inline void packed_block_dots(const uint8_t* blk, const int8_t* const* xb, __m256i* lo,
                              __m256i* hi) {
#if defined(OFFICELLM_QMM_VNNI)
  __m256i w[8];
  load_packed_steps<F>(blk, w);
  block_dots<F, MR>(w, xb, lo, hi);
#else
  if constexpr (F == GGML_Q8_0) {
    packed_q8_dots<MR>(blk + packed_scale_bytes<F>(), xb, lo);
  } else if constexpr (F == GGML_Q6_K) {
    packed_q6_half_dots<MR>(blk + packed_scale_bytes<F>(), xb, 0, lo);
    packed_q6_half_dots<MR>(blk + packed_scale_bytes<F>(), xb, 4, hi);
  } else {
    packed_nibble_dots<MR>(blk + packed_scale_bytes<F>(), xb, lo);
  }
#endif
}

inline __m256 load_halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A packed block's eight rows' scales, part `at` of its scale bytes (0: the scales; 1: the
// offsets, or Q6_K's second-half scales): fp16 for the 32-weight formats, float32 for the
// K-quants.
template <int64_t F>
inline __m256 packed_scales(const uint8_t* blk, int at) {
  if constexpr (K_QUANT<F>) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(blk + 32 * at));
  } else {
    return load_halves(blk + 16 * at);
  }
}

// tile() over one packed group: the same operations in the same order.
template <int64_t F, int MR>
inline void packed_tile(const uint8_t* grp, const QuantizedRows& xq, float* y, int64_t M,
                        int64_t N, int64_t nb, int64_t n, int64_t m) {
  constexpr int64_t PB = packed_block_bytes<F>();
  const int64_t K = nb * QK;
  const int8_t* qx = xq.q.data();
  const float* dx = xq.d.data();
  const int32_t* isum = xq.isum.data();
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * PB;
    __m256i lo[MR], hi[MR];
    const int8_t* xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = qx + (m + r) * K + b * QK;
    packed_block_dots<F, MR>(blk, xb, lo, hi);
    const __m256 dw = packed_scales<F>(blk, 0);
    for (int r = 0; r < MR; ++r) {
      const float d = dx[b * M + m + r];
      acc[r] = add_term(acc[r], lo[r], unsigned_correction<F>(isum, b, M, m + r, 0), dw, d);
      if constexpr (F == GGML_Q6_K)
        acc[r] = add_term(acc[r], hi[r], unsigned_correction<F>(isum, b, M, m + r, 1),
                          packed_scales<F>(blk, 1), d);
    }
  }
  if constexpr (HAS_OFFSET<F>) {
    add_offsets<MR>(acc, [&](int64_t b) { return packed_scales<F>(grp + b * PB, 1); },
                    xq.sum.data() + m, M, nb);
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(y + (m + r) * N + n, acc[r]);
}

template <int64_t F>
void run_packed(const uint8_t* packed, const QuantizedRows& xq, float* y, int64_t M, int64_t N,
                int64_t nb) {
  constexpr int64_t PB = packed_block_bytes<F>();
  at::parallel_for(0, N / 8, 4, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* grp = packed + g * nb * PB;
      over_tiles(M, [&](auto mr, int64_t m) {
        packed_tile<F, decltype(mr)::value>(grp, xq, y, M, N, nb, 8 * g, m);
      });
    }
  });
}

#else  // portable C++: the same integers and float operations, one weight row at a time

// Block b's 32 weights as the integers they stand for (Q4_0's q - 8, Q6_K's q - 32).
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
  const int8_t* qx = xq.q.data();
  const float* dx = xq.d.data();
  const float* sx = xq.sum.data();
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

static torch::Tensor float_matmul(const torch::Tensor& x, const torch::Tensor& weight,
                                  int64_t format);

namespace {

// quant_matmul over quant_pack's layout.
torch::Tensor packed_matmul(const torch::Tensor& x, const torch::Tensor& packed, int64_t format) {
#if defined(OFFICELLM_QMM_AVX2)
  const int64_t pb = packed_block_bytes(format);
  TORCH_CHECK(pb > 0 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() &&
                  packed.size(2) == pb,
              "not a packed weight of GGUF type ", format);
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 8, nb = packed.size(1);
  TORCH_CHECK(K == nb * QK, "x has ", K, " features, the packed weight ", nb * QK);
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const QuantizedRows xq = quantize_rows(x.contiguous());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  switch (format) {
    case GGML_Q4_0: run_packed<GGML_Q4_0>(w, xq, yp, M, N, nb); break;
    case GGML_Q4_1: run_packed<GGML_Q4_1>(w, xq, yp, M, N, nb); break;
    case GGML_Q4_K: run_packed<GGML_Q4_K>(w, xq, yp, M, N, nb); break;
    case GGML_Q6_K: run_packed<GGML_Q6_K>(w, xq, yp, M, N, nb); break;
    default: run_packed<GGML_Q8_0>(w, xq, yp, M, N, nb); break;
  }
  return y;
#else
  (void)x, (void)format;
  TORCH_CHECK(false, "this build reads no packed weights (quant_pack returned the rows)");
  return packed;
#endif
}

}  // namespace

// weight: uint8 [N, row bytes] of `format` groups (a GGUF tensor's rows). Returns the packed
// layout above, uint8 [N / 8, K / 32, packed block bytes], where this build has one for the
// format and N is a multiple of 8; else `weight` itself (quant_matmul reads both).
torch::Tensor quant_pack(torch::Tensor weight, int64_t format) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kUInt8 && weight.is_contiguous(),
              "weight must be contiguous uint8 [N, row bytes]");
#if defined(OFFICELLM_QMM_AVX2)
  const int64_t pb = packed_block_bytes(format), N = weight.size(0);
  if (pb == 0 || N % 8 != 0 || N == 0) return weight;
  TORCH_CHECK(weight.size(1) % group_bytes(format) == 0, "weight rows are not whole blocks");
  // 32-weight blocks per row (a K-quant group holds eight).
  const int64_t nb = weight.size(1) / group_bytes(format) * (group_weights(format) / QK);
  torch::Tensor out = torch::empty({N / 8, nb, pb}, weight.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  switch (format) {
    case GGML_Q4_0: pack_groups<GGML_Q4_0>(w, weight.size(1), nb, o, N / 8); break;
    case GGML_Q4_1: pack_groups<GGML_Q4_1>(w, weight.size(1), nb, o, N / 8); break;
    case GGML_Q4_K: pack_groups<GGML_Q4_K>(w, weight.size(1), nb, o, N / 8); break;
    case GGML_Q6_K: pack_groups<GGML_Q6_K>(w, weight.size(1), nb, o, N / 8); break;
    default: pack_groups<GGML_Q8_0>(w, weight.size(1), nb, o, N / 8); break;
  }
  return out;
#else
  (void)format;
  return weight;  // the portable path reads the rows one at a time: nothing to gain
#endif
}

// x [M, K] float32, bfloat16 or float16; weight: uint8 [N, K / group weights * group bytes]
// of `format` groups (a GGUF tensor's rows), or quant_pack's layout of them. Returns [M, N]
// in x's dtype (computed in float32).
torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor weight, int64_t format) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), "x must be float [M, K]");
  // A bf16 model's rows: converted here rather than by two more ops in Python per matmul
  // (a one-row decode step makes 121 of these calls on SmolLM2); float32 inside either way.
  if (x.scalar_type() != torch::kFloat32) {
    return float_matmul(x.to(torch::kFloat32), weight, format).to(x.scalar_type());
  }
  return float_matmul(x, weight, format);
}

// quant_matmul of a float32 x.
static torch::Tensor float_matmul(const torch::Tensor& x, const torch::Tensor& weight,
                                  int64_t format) {
  if (weight.dim() == 3) return packed_matmul(x, weight, format);
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

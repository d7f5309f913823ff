// quant_matmul's AVX2 path (vpmaddubsw + vpmaddwd), and AVX-512 VNNI's (vpdpbusd) where the
// build has it: x quantized a vector at a time, eight weight rows per tile, and the packed
// layout of quant_pack. quant_matmul.cpp includes it when the build has AVX2 + FMA + F16C.

#pragma once

#include "quant_matmul_formats.h"

namespace {

float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

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
  out.sum = out.d * static_cast<float>(out.halves[0] + out.halves[1]);
  return out;
}

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

// A vector of nibble pairs as its two steps: low nibbles (weights j) and high (j + 16), as
// the integers the dots take (MXFP4's looked up as level + 12).
template <int64_t F>
inline void split_nibbles(__m256i v, __m256i& low, __m256i& high) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  low = _mm256_and_si256(v, nibble);
  high = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  if constexpr (F == GGML_MXFP4) {
    const __m256i levels = _mm256_broadcastsi128_si256(
        _mm_load_si128(reinterpret_cast<const __m128i*>(MXFP4_BIASED)));
    low = _mm256_shuffle_epi8(levels, low);
    high = _mm256_shuffle_epi8(levels, high);
  }
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
  } else if constexpr (F == GGML_Q4_0 || F == GGML_Q4_1 || F == GGML_MXFP4) {
    // Byte j's low nibble is weight j, its high nibble weight j + 16: dword t gives steps t
    // and t + 4.
    __m256i v[4];
    transpose_8x4(rows, at + (F == GGML_Q4_1 ? 4 : F == GGML_MXFP4 ? 1 : 2), v);
    for (int t = 0; t < 4; ++t) split_nibbles<F>(v[t], w[t], w[t + 4]);
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
  } else if constexpr (F == GGML_MXFP4) {
    // Levels + 12 (up to 24): four steps' pairs (4 * 2 * 24 * 127) fit int16, then widened.
    for (int s0 = 0; s0 < 8; s0 += 4) {
      for (int r = 0; r < MR; ++r) {
        __m256i a = _mm256_maddubs_epi16(w[s0], x_step(xb[r], s0));
        for (int s = s0 + 1; s < s0 + 4; ++s)
          a = _mm256_add_epi16(a, _mm256_maddubs_epi16(w[s], x_step(xb[r], s)));
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(a, ones));
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
inline void tile(const uint8_t* const* rows, const GroupScales& gs, const XBlocks& xq,
                 float* y, int64_t M, int64_t N, int64_t nb, int64_t n, int64_t valid,
                 int64_t m) {
  const int64_t K = nb * QK;
  const int8_t* qx = xq.q;
  const float* dx = xq.d;
  const int32_t* isum = xq.isum;
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
                    xq.sum + m, M, nb);
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
void matmul_rows(const uint8_t* w, int64_t row_bytes, const XBlocks& xq, float* y,
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

// The packed layout (quant_pack): a group of eight weight rows stored unit by unit along K,
// its quants already in the lanes the vectors read. A 32-weight format's unit is one block:
// its eight rows' scales (fp16; MXFP4's exponent bytes; then Q4_1's offsets) and its quants,
// Q8_0's as eight step vectors, the 4-bit ones' as four vectors of nibble pairs (steps t and
// t + 4). A K-quant's unit is one 256-weight group of the eight rows: a header of their
// super-block scales as float32 (d, and Q4_K's -dmin), then its eight blocks, each its eight
// rows' 6-bit (Q4_K: unsigned scale and min) or int8 (Q6_K: first- and second-half) scales
// as bytes and its quants as nibble pairs, Q6_K's top two bits in two more vectors (the
// steps 0-3 and 4-7, step s % 4 at bits 2 (s % 4) of each byte). A block costs a few loads,
// shifts and one scale product (d * sc, exactly decode_row_scales' float product) instead of
// four 8 x 4 transposes and 16 scalar scale conversions (a K-quant's 6-bit scales unpacked
// and bit planes joined per block and tile). The bytes stay within 6% of GGUF's rows (Q4_K
// 144 -> 152 B per 8 x 32 weights, Q6_K 210 -> 212): one row of x (a user typing) is bound by
// the bytes it reads, a few rows by the work per block, and this layout cuts both.
template <int64_t F>
constexpr bool K_QUANT = F == GGML_Q4_K || F == GGML_Q6_K;

// Blocks per packed unit: a K-quant's group of eight, else one.
template <int64_t F>
constexpr int64_t packed_unit_blocks() {
  return K_QUANT<F> ? 8 : 1;
}

// Bytes of a unit's header: a K-quant's eight rows' d (then Q4_K's -dmin) as float32.
template <int64_t F>
constexpr int64_t packed_header_bytes() {
  return F == GGML_Q4_K ? 64 : F == GGML_Q6_K ? 32 : 0;
}

// Bytes of a block before its quants: eight rows' scales (and offsets, or second halves).
template <int64_t F>
constexpr int64_t packed_scale_bytes() {
  return K_QUANT<F> ? 16 : F == GGML_Q4_1 ? 32 : F == GGML_MXFP4 ? 8 : 16;
}

template <int64_t F>
constexpr int64_t packed_block_bytes() {
  return packed_scale_bytes<F>() + (F == GGML_Q8_0 ? 256 : F == GGML_Q6_K ? 192 : 128);
}

template <int64_t F>
constexpr int64_t packed_unit_bytes() {
  return packed_header_bytes<F>() + packed_unit_blocks<F>() * packed_block_bytes<F>();
}

// Block b of a packed group, and the header of its unit.
template <int64_t F>
inline const uint8_t* packed_block(const uint8_t* grp, int64_t b) {
  constexpr int64_t UB = packed_unit_blocks<F>();
  return grp + b / UB * packed_unit_bytes<F>() + packed_header_bytes<F>() +
         b % UB * packed_block_bytes<F>();
}

template <int64_t F>
inline const float* packed_header(const uint8_t* grp, int64_t b) {
  return reinterpret_cast<const float*>(grp + b / packed_unit_blocks<F>() * packed_unit_bytes<F>());
}

// (weights, bytes) of a packed unit of `format`; (0, 0) where it has no packed layout.
inline std::pair<int64_t, int64_t> packed_unit(int64_t format) {
  if (group_weights(format) == 0) return {0, 0};
  std::pair<int64_t, int64_t> unit;
  with_format(format, [&](auto f) {
    constexpr int64_t F = decltype(f)::value;
    unit = {packed_unit_blocks<F>() * QK, packed_unit_bytes<F>()};
  });
  return unit;
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

// Block j's integer scales of a K-quant group as stored: Q4_K's 6-bit scale and min,
// Q6_K's two int8 half scales (as bytes).
template <int64_t F>
std::pair<uint8_t, uint8_t> k_quant_scales(const uint8_t* grp, int64_t j) {
  if constexpr (F == GGML_Q4_K) {
    // Bytes 0-3 and 4-7 hold blocks 0-3's scales and mins in their low six bits; bytes
    // 8-11 blocks 4-7's low four bits, their top two bits the top two of bytes 0-3 / 4-7
    // (decode_row_scales reads them so).
    const uint8_t* s = grp + 4;
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    return {static_cast<uint8_t>(sc), static_cast<uint8_t>(mn)};
  } else {
    return {grp[192 + 2 * j], grp[192 + 2 * j + 1]};
  }
}

// A K-quant group of eight rows into packed units, lane by lane (load time only).
template <int64_t F>
void pack_k_quant_group(const uint8_t* const* rows, int64_t nb, uint8_t* out) {
  constexpr int64_t PB = packed_block_bytes<F>();
  constexpr int64_t SB = packed_scale_bytes<F>();
  constexpr int64_t UNIT = packed_unit_bytes<F>();
  constexpr int64_t HEAD = packed_header_bytes<F>();
  std::memset(out, 0, nb / 8 * UNIT);  // Q6_K's top bits are or-ed in
  for (int l = 0; l < 8; ++l) {
    for (int64_t g = 0; g < nb / 8; ++g) {
      const uint8_t* grp = rows[l] + g * group_bytes(F);
      uint8_t* unit = out + g * UNIT;
      // The super-block scales as decode_row_scales has them; -dmin so that a min's term
      // (-dmin) * mn is its -(dmin * mn), bit for bit (a product's rounding is symmetric).
      const float d = half_to_float(F == GGML_Q4_K ? grp : grp + 208);
      std::memcpy(unit + 4 * l, &d, 4);
      if constexpr (F == GGML_Q4_K) {
        const float neg_dmin = -half_to_float(grp + 2);
        std::memcpy(unit + 32 + 4 * l, &neg_dmin, 4);
      }
      for (int64_t j = 0; j < 8; ++j) {
        uint8_t* blk = unit + HEAD + j * PB;
        const auto [first, second] = k_quant_scales<F>(grp, j);
        blk[l] = first;
        blk[8 + l] = second;
        uint8_t q[QK];
        k_quant_block<F>(rows[l], g * 8 + j, q);
        // Vector t, lane l: four bytes, byte i holding weight 4t + i (low nibble) and
        // 4t + i + 16 (high), as Q4_1 stores them; Q6_K's top bits of weight 4s + i at bits
        // 2 (s % 4) of byte i, lane l, of top-bit vector s / 4.
        for (int64_t w = 0; w < QK / 2; ++w)
          blk[SB + 32 * (w / 4) + 4 * l + w % 4] =
              static_cast<uint8_t>((q[w] & 0x0f) | ((q[w + 16] & 0x0f) << 4));
        if constexpr (F == GGML_Q6_K) {
          for (int64_t w = 0; w < QK; ++w) {
            const int64_t s = w / 4;
            blk[SB + 128 + 32 * (s / 4) + 4 * l + w % 4] |=
                static_cast<uint8_t>((q[w] >> 4) << (2 * (s % 4)));
          }
        }
      }
    }
  }
}

template <int64_t F>
void pack_groups(const uint8_t* w, int64_t row_bytes, int64_t nb, uint8_t* out, int64_t groups) {
  constexpr int64_t PB = packed_block_bytes<F>();
  const int64_t group_stride = nb / packed_unit_blocks<F>() * packed_unit_bytes<F>();
  at::parallel_for(0, groups, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* rows[8];
      for (int l = 0; l < 8; ++l) rows[l] = w + (8 * g + l) * row_bytes;
      if constexpr (K_QUANT<F>) {
        pack_k_quant_group<F>(rows, nb, out + g * group_stride);
      } else {
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* blk = out + (g * nb + b) * PB;
          const int64_t at = b * group_bytes(F);
          constexpr int64_t SCALE = F == GGML_MXFP4 ? 1 : 2;  // bytes of d (an exponent)
          for (int l = 0; l < 8; ++l) {
            std::memcpy(blk + SCALE * l, rows[l] + at, SCALE);
            if constexpr (F == GGML_Q4_1) std::memcpy(blk + 16 + 2 * l, rows[l] + at + 2, 2);
          }
          __m256i v[8];
          constexpr int VECTORS = F == GGML_Q8_0 ? 8 : 4;
          if constexpr (F == GGML_Q8_0) {
            transpose_8x4(rows, at + 2, v);
            transpose_8x4(rows, at + 18, v + 4);
          } else {
            transpose_8x4(rows, at + (F == GGML_Q4_1 ? 4 : SCALE), v);
          }
          for (int t = 0; t < VECTORS; ++t)
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(blk + packed_scale_bytes<F>() + 32 * t), v[t]);
        }
      }
    }
  });
}

// Q6_K's top two bits of step s, from its top-bit vector (s / 4), moved to bits 4-5 of each
// byte (16-bit shifts: what crosses a byte is masked off).
inline __m256i q6_top_bits(__m256i top, int s) {
  const int k = s % 4;
  const __m256i at = k == 0 ? _mm256_slli_epi16(top, 4) : k == 1 ? _mm256_slli_epi16(top, 2)
                     : k == 2 ? top : _mm256_srli_epi16(top, 2);
  return _mm256_and_si256(at, _mm256_set1_epi8(0x30));
}

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// A packed block's eight steps, as load_steps gives them from the rows.
template <int64_t F>
inline void load_packed_steps(const uint8_t* blk, __m256i* w) {
  const uint8_t* q = blk + packed_scale_bytes<F>();
  if constexpr (F == GGML_Q8_0) {
    for (int s = 0; s < 8; ++s) w[s] = load32(q + 32 * s);
  } else if constexpr (F == GGML_Q6_K) {
    // The low nibbles as Q4_K's, each step's top two bits or-ed in above them.
    for (int t = 0; t < 4; ++t) split_nibbles<GGML_Q4_K>(load32(q + 32 * t), w[t], w[t + 4]);
    const __m256i top[2] = {load32(q + 128), load32(q + 160)};
    for (int s = 0; s < 8; ++s) w[s] = _mm256_or_si256(w[s], q6_top_bits(top[s / 4], s));
  } else {
    for (int t = 0; t < 4; ++t) split_nibbles<F>(load32(q + 32 * t), w[t], w[t + 4]);
  }
}

#if !defined(OFFICELLM_QMM_VNNI)
// The 4-bit formats' block_dots on AVX2, straight from a packed block: each 32-byte load is
// split into its two steps (t, t + 4) and used at once by every x row, so only two weight
// vectors are live instead of eight (with all eight, GCC computed the tile's 32 products
// first and spilled them to the stack).
template <int64_t F, int MR>
inline void packed_nibble_dots(const uint8_t* q, const int8_t* const* xb, __m256i* lo) {
  // 4-bit q: all eight steps' pairs (8 * 2 * 15 * 127) fit int16, widened once; MXFP4's
  // levels + 12 (up to 24) four steps' (two vectors' worth), so widened twice.
  constexpr int WIDEN_EVERY = F == GGML_MXFP4 ? 2 : 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[MR];
  for (int r = 0; r < MR; ++r) lo[r] = a[r] = _mm256_setzero_si256();
  // Kept a loop: unrolled, GCC reassociates the integer sums into a tree and computes every
  // product first (the spills this function exists to avoid).
#pragma GCC unroll 1
  for (int t = 0; t < 4; ++t) {
    __m256i wl, wh;
    split_nibbles<F>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * t)), wl, wh);
    for (int r = 0; r < MR; ++r) {
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wl, x_step(xb[r], t)),
                                         _mm256_maddubs_epi16(wh, x_step(xb[r], t + 4)));
      a[r] = _mm256_add_epi16(a[r], p);
    }
    if (t % WIDEN_EVERY == WIDEN_EVERY - 1) {
      for (int r = 0; r < MR; ++r) {
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(a[r], ones));
        a[r] = _mm256_setzero_si256();
      }
    }
  }
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

// Q6_K's step s from a packed block's quants: its nibble vector's low (s < 4) or high
// nibbles, its top two bits or-ed in above them.
inline __m256i packed_q6_step(const uint8_t* q, int s) {
  const __m256i nibbles = load32(q + 32 * (s % 4));
  const __m256i low = _mm256_and_si256(s < 4 ? nibbles : _mm256_srli_epi16(nibbles, 4),
                                       _mm256_set1_epi8(0x0f));
  return _mm256_or_si256(low, q6_top_bits(load32(q + 128 + 32 * (s / 4)), s));
}

// Q6_K's block_dots on AVX2 from a packed block: steps 0-3 (the first 16 weights) into lo,
// 4-7 into hi, each a pair of steps at a time (2 * 2 * 63 * 127 fits int16), then widened.
template <int MR>
inline void packed_q6_half_dots(const uint8_t* q, const int8_t* const* xb, int s0, __m256i* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int s = s0; s < s0 + 4; s += 2) {
    const __m256i w0 = packed_q6_step(q, s);
    const __m256i w1 = packed_q6_step(q, s + 1);
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
    packed_nibble_dots<F, MR>(blk + packed_scale_bytes<F>(), xb, lo);
  }
#endif
}

inline __m256 load_halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Block b's eight rows' scales in a packed group, part `at` (0: the scales; 1: the offsets,
// or Q6_K's second-half scales): fp16 for the 32-weight formats, and a K-quant's d * sc (or
// -dmin * mn) from its unit's header and its block's bytes, decode_row_scales' product.
template <int64_t F>
inline __m256 packed_scales(const uint8_t* grp, int64_t b, int at) {
  const uint8_t* blk = packed_block<F>(grp, b);
  if constexpr (F == GGML_MXFP4) {  // e8m0_half of eight exponent bytes
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk)));
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(
        _mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, one)));
  } else if constexpr (K_QUANT<F>) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * at));
    const __m256i ints = F == GGML_Q4_K ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
    const float* super = packed_header<F>(grp, b) + (F == GGML_Q4_K ? 8 * at : 0);
    return _mm256_mul_ps(_mm256_loadu_ps(super), _mm256_cvtepi32_ps(ints));
  } else {
    return load_halves(blk + 16 * at);
  }
}

// How far ahead of the block it reads a tile asks for the group's bytes, and into which
// cache: one row of x is bound by memory. Into L2, 8 KB ahead: a Q4_K gate/up stream from
// memory went from 14 to 17-20 GB/s (of ~23 a plain read gets) on the 2-core Xeon VM, AVX2
// and VNNI alike; into L1 (T0) at 1 to 16 KB it stayed at 14-15 (each T0 request holds one
// of the core's few L1 fill buffers, T1 one of L2's many), and the hardware prefetcher
// alone left it at ~12.
constexpr int64_t PREFETCH_BYTES = 8192;

// tile() over one packed group: the same operations in the same order.
template <int64_t F, int MR>
inline void packed_tile(const uint8_t* grp, const XBlocks& xq, float* y, int64_t M,
                        int64_t N, int64_t nb, int64_t n, int64_t m) {
  const int64_t K = nb * QK;
  const int8_t* qx = xq.q;
  const float* dx = xq.d;
  const int32_t* isum = xq.isum;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i lo[MR], hi[MR];
    const int8_t* xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = qx + (m + r) * K + b * QK;
    const uint8_t* blk = packed_block<F>(grp, b);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BYTES), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BYTES + 64), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BYTES + 128), _MM_HINT_T1);
    packed_block_dots<F, MR>(blk, xb, lo, hi);
    const __m256 dw = packed_scales<F>(grp, b, 0);
    for (int r = 0; r < MR; ++r) {
      const float d = dx[b * M + m + r];
      acc[r] = add_term(acc[r], lo[r], unsigned_correction<F>(isum, b, M, m + r, 0), dw, d);
      if constexpr (F == GGML_Q6_K)
        acc[r] = add_term(acc[r], hi[r], unsigned_correction<F>(isum, b, M, m + r, 1),
                          packed_scales<F>(grp, b, 1), d);
    }
  }
  if constexpr (HAS_OFFSET<F>) {
    add_offsets<MR>(acc, [&](int64_t b) { return packed_scales<F>(grp, b, 1); },
                    xq.sum + m, M, nb);
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(y + (m + r) * N + n, acc[r]);
}

// Rows [8 g0, 8 g1) of y for all M rows of x, from the packed groups g0..g1 - 1.
template <int64_t F>
void packed_rows(const uint8_t* packed, const XBlocks& xq, float* y, int64_t M, int64_t N,
                 int64_t nb, int64_t g0, int64_t g1) {
  const int64_t group_stride = nb / packed_unit_blocks<F>() * packed_unit_bytes<F>();
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* grp = packed + g * group_stride;
    over_tiles(M, [&](auto mr, int64_t m) {
      packed_tile<F, decltype(mr)::value>(grp, xq, y, M, N, nb, 8 * g, m);
    });
  }
}

template <int64_t F>
void run_packed(const uint8_t* packed, const XBlocks& xq, float* y, int64_t M, int64_t N,
                int64_t nb) {
  at::parallel_for(0, N / 8, 4, [&](int64_t begin, int64_t end) {
    packed_rows<F>(packed, xq, y, M, N, nb, begin, end);
  });
}

// quant_matmul over quant_pack's layout, uint8 [N / 8, K / unit weights, unit bytes].
at::Tensor packed_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t format) {
  const auto [unit_weights, unit_bytes] = packed_unit(format);
  TORCH_CHECK(unit_bytes > 0 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(2) == unit_bytes,
              "not a packed weight of GGUF type ", format);
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 8;
  TORCH_CHECK(K == packed.size(1) * unit_weights, "x has ", K, " features, the packed weight ",
              packed.size(1) * unit_weights);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const QuantizedRows xq = quantize_rows(x.contiguous());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  with_format(format, [&](auto f) {
    run_packed<decltype(f)::value>(w, xq.view(), yp, M, N, K / QK);
  });
  return y;
}

// quant_pack's layout of `weight` (see quant_pack), or `weight` itself where there is none.
at::Tensor pack_weight(at::Tensor weight, int64_t format) {
  const auto [unit_weights, unit_bytes] = packed_unit(format);
  const int64_t N = weight.size(0);
  if (unit_bytes == 0 || N % 8 != 0 || N == 0) return weight;
  TORCH_CHECK(weight.size(1) % group_bytes(format) == 0, "weight rows are not whole blocks");
  const int64_t K = weight.size(1) / group_bytes(format) * group_weights(format);
  at::Tensor out = at::empty({N / 8, K / unit_weights, unit_bytes}, weight.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  with_format(format, [&](auto f) {
    pack_groups<decltype(f)::value>(w, weight.size(1), K / QK, o, N / 8);
  });
  return out;
}

// The path's name (quant_matmul_path).
#if defined(OFFICELLM_QMM_VNNI)
constexpr const char* kQuantMatmulPath = "avx512_vnni";
#else
constexpr const char* kQuantMatmulPath = "avx2";
#endif

}  // namespace

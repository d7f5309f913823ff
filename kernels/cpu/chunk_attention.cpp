// Causal attention of a prompt chunk's rows over their sequence's paged KV cache
// (paged_chunk_attention): the chunk kernel below where the build has AVX2 and the head size
// is one of its own, else row by row through decode_attention.cpp's kernel.
//
// Built on first use by kernels/build/cpu_kernels.py, with the other CPU kernels.

#include "entry_points.h"
#include "paged_attention.h"

namespace {

#ifdef OFFICELLM_AVX2_F32Q
#define OFFICELLM_CHUNK_KERNEL 1
// Chunk attention: the R query rows of one sequence's prompt chunk over its cached history,
// row r attending the first seq_len - R + 1 + r keys. Run row by row through the decode
// kernel, each row re-reads and re-converts the whole history and shares each key with only
// its group's G query heads: ~23 cycles per (key, query head) at SmolLM2's shape on AVX2,
// where the arithmetic needs 8. Here a block's keys and values are converted once into float
// rows that all R x G query heads of their KV head share, q.k and p.v are register-tiled
// products (2 heads x 4 keys; 2 heads x 32 values), and only the last R keys are masked, each
// row's visible keys being a prefix of a block. Blocks hold R x more work than a decode's,
// so a context is cut into smaller parts.
constexpr int64_t kMinChunkPartBlocks = 2;

// exp(x) for x <= 0, 8 at a time: e^x = 2^n e^r with n = round(x log2 e) and |r| <= ln2/2,
// e^r by a degree-7 polynomial (Cephes' expf coefficients; relative error ~1e-7). Inputs
// below -87 give e^-87 ~ 1.6e-38 rather than 0 (a normal float, no denormals); callers zero
// what must be exactly 0. Inline: libmvec's call per 8 values plus the scalar max, sum and
// correction, head by head, were ~20% of a chunk's attention time. (The decode kernels keep
// online_softmax_block: there a block has only its group's few heads, and this vector code,
// tried there, was 1-12% slower.)
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

// Lanes [0, count) of a vector set, the rest clear (count may be over 8 or under 0).
inline __m256i first_lanes(int64_t count) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(
      _mm256_set1_epi32(static_cast<int32_t>(std::clamp<int64_t>(count, 0, 8))), iota);
}

// Lanes [from, to) of a vector set, the rest clear (either may be outside 0..8); with
// kFrom false, from is taken as 0 and not looked at (the lower bound of a sliding window is
// the one mask more; full attention does without it, ~5 % of a chunk's time).
template <bool kFrom>
inline __m256 lanes_between(int64_t from, int64_t to) {
  if constexpr (kFrom) {
    return _mm256_castsi256_ps(_mm256_andnot_si256(first_lanes(from), first_lanes(to)));
  } else {
    return _mm256_castsi256_ps(first_lanes(to));
  }
}

// Which keys of a block a query head sees: [from, to), counted from the block's first key
// (either may fall outside the block: a head that sees none of it has from >= to).
struct VisibleKeys {
  int64_t from;
  int64_t to;
};

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// A loaded vector that the FMAs after it must read from a register. Left alone, GCC folds
// the load into each FMA that uses it as a memory operand (twice or more per vector here),
// and the tiles below then wait on the load ports instead of the FMA units.
inline __m256 in_register(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

// Scores of NH (1 or 2) query heads against keys t..t+3 of a block's float key rows.
template <int64_t D, int64_t NH>
inline void score_tile(const float* qh, const float* keys, float* probs, int64_t padded,
                       int64_t t) {
  __m256 s[NH][4];
  for (int64_t n = 0; n < NH; ++n)
    for (int64_t j = 0; j < 4; ++j) s[n][j] = _mm256_setzero_ps();
  for (int64_t v = 0; v < D / 8; ++v) {
    __m256 k[4];
    for (int64_t j = 0; j < 4; ++j) k[j] = in_register(_mm256_loadu_ps(keys + (t + j) * D + v * 8));
    for (int64_t n = 0; n < NH; ++n) {
      const __m256 qv = _mm256_loadu_ps(qh + n * D + v * 8);
      for (int64_t j = 0; j < 4; ++j) s[n][j] = _mm256_fmadd_ps(qv, k[j], s[n][j]);
    }
  }
  for (int64_t n = 0; n < NH; ++n) {
    _mm_storeu_ps(probs + n * padded + t, hsum4(s[n][0], s[n][1], s[n][2], s[n][3]));
  }
}

// NH (1 or 2) query heads' accumulators, values c0..c0+31: rescaled by their heads'
// corrections, then plus p.v over the block's tokens. 3 heads would take all 16 of AVX2's
// registers (12 accumulators, 3 probabilities, a value vector), and GCC then spills the
// accumulators every token.
template <int64_t D, int64_t NH>
inline void value_tile(const float* probs, const float* vals, const float* corr, float* acc,
                       int64_t padded, int64_t tokens, int64_t c0) {
  __m256 a[NH][4];
  for (int64_t n = 0; n < NH; ++n) {
    const __m256 c = _mm256_set1_ps(corr[n]);
    for (int64_t j = 0; j < 4; ++j) {
      a[n][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + n * D + c0 + j * 8), c);
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    __m256 p[NH];
    for (int64_t n = 0; n < NH; ++n) p[n] = _mm256_broadcast_ss(probs + n * padded + t);
    for (int64_t j = 0; j < 4; ++j) {
      const __m256 vv = in_register(_mm256_loadu_ps(vals + t * D + c0 + j * 8));
      for (int64_t n = 0; n < NH; ++n) a[n][j] = _mm256_fmadd_ps(p[n], vv, a[n][j]);
    }
  }
  for (int64_t n = 0; n < NH; ++n)
    for (int64_t j = 0; j < 4; ++j) _mm256_storeu_ps(acc + n * D + c0 + j * 8, a[n][j]);
}

// The online softmax of one block for many query heads at once: head n's scores are
// p[n * stride, + tokens), of which it sees those visible(n) (a VisibleKeys: none to all;
// its other lanes, up to the next multiple of 8, are written as 0; kFrom false: every head's
// from is 0 or less, a full-attention chunk's). Heads are independent,
// so each step runs over all of them before the next (the exps' dependency chains overlap
// instead of stalling head by head), and the corrections are taken 8 heads at a time. corr
// gets each head's correction (room for heads rounded up to 8); new_max is scratch (heads).
template <bool kFrom, typename Visible>
inline void softmax_heads(float* p, int64_t stride, int64_t heads, int64_t tokens,
                          Visible&& visible, float* run_max, float* run_sum, float* corr,
                          float* new_max) {
  const int64_t heads8 = (heads + 7) / 8 * 8;
  float* shrink = corr;
  // Never past the block's last key: a block the window shortened leaves stale scores in
  // its lanes up to the next multiple of 8.
  auto seen_in = [&](int64_t n) {
    const VisibleKeys v = visible(n);
    return VisibleKeys{v.from, std::min(v.to, tokens)};
  };
  for (int64_t n = 0; n < heads; ++n) {
    const VisibleKeys seen = seen_in(n);
    __m256 m = _mm256_set1_ps(-1e30f);
    for (int64_t t = 0; t < tokens; t += 8) {
      m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-1e30f), _mm256_loadu_ps(p + n * stride + t),
                                            lanes_between<kFrom>(seen.from - t, seen.to - t)));
    }
    new_max[n] = std::max(run_max[n], hmax8(m));
    shrink[n] = run_max[n] - new_max[n];
  }
  for (int64_t n = 0; n < heads8; n += 8) {
    _mm256_storeu_ps(shrink + n, exp_nonpositive(_mm256_loadu_ps(shrink + n)));
  }
  for (int64_t n = 0; n < heads; ++n) {
    const VisibleKeys seen = seen_in(n);
    const __m256 shift = _mm256_set1_ps(new_max[n]);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < tokens; t += 8) {
      float* at = p + n * stride + t;
      const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(at), shift)),
                                     lanes_between<kFrom>(seen.from - t, seen.to - t));
      _mm256_storeu_ps(at, e);
      sum = _mm256_add_ps(sum, e);
    }
    run_sum[n] = run_sum[n] * shrink[n] + hsum8(sum);
    run_max[n] = new_max[n];
  }
}

// T is the query's (and output's) type, C the cache's (any the decode kernel reads). With a
// window (> 0) row r also hides the keys before its window; the blocks before the first
// row's window are not read, and each row's hidden keys in the blocks that are read get
// weight 0. sinks: [num_q_heads] or nullptr.
template <typename T, typename C, int64_t D>
void chunk_attention(const T* q, const C* k_cache, const C* v_cache, const int64_t* table,
                     int64_t seq_len, int64_t window, const float* sinks, T* out, int64_t rows,
                     int64_t num_q_heads, int64_t num_kv_heads, int64_t block_size,
                     float scale) {
  static_assert(D % 32 == 0, "value tiles are 32 wide");
  const int64_t group = num_q_heads / num_kv_heads;
  // The query heads of one KV head: every row's group, row-major (row, head in group).
  const int64_t heads = rows * group;
  const int64_t row_elems = D + row_extra<C>();
  const int64_t token_stride = num_kv_heads * row_elems;
  const int64_t padded = (block_size + 7) / 8 * 8;
  const int64_t first_row_keys = seq_len - rows + 1;
  // Row r sees keys [first_row_keys + r - window, first_row_keys + r) (without a window, all
  // up to its end); the chunk reads from its first row's first visible key on.
  const int64_t from = window_start(seq_len - rows, window);
  // Each KV head is an item of its own (as a sequence would be to the decode kernel), so a
  // short history still gives every thread work.
  const std::vector<int64_t> seq_lens(num_kv_heads, seq_len), starts(num_kv_heads, from);
  over_context_parts(num_kv_heads, seq_lens.data(), starts.data(), block_size, heads, D,
                     kMinChunkPartBlocks, Split::kAdaptive,
                     [&](int64_t h, int64_t first, int64_t end, PartState st) {
    std::vector<float> qh(heads * D), keys(padded * D, 0.0f), vals(block_size * D),
        probs(heads * padded), corr((heads + 7) / 8 * 8, 0.0f), new_max(heads);
    for (int64_t n = 0; n < heads; ++n) {
      const T* src = q + ((n / group) * num_q_heads + h * group + n % group) * D;
      for (int64_t i = 0; i < D; ++i) qh[n * D + i] = to_float(src[i]) * scale;
    }
    // The position of the block's first key read (the window's first block starts at from).
    int64_t start = std::max(first * block_size, from);
    walk_blocks(k_cache + h * row_elems, v_cache + h * row_elems, table, first, end, seq_len,
                from, block_size, token_stride, 2,
                [&](const C* k_block, const C* v_block, int64_t tokens, Prefetcher& prefetcher) {
      const int64_t tokens4 = (tokens + 3) / 4 * 4;
      for (int64_t t = 0; t < tokens; ++t) {
        prefetcher.step();
        load_row(k_block + t * token_stride, keys.data() + t * D, D);
        prefetcher.step();
        load_row(v_block + t * token_stride, vals.data() + t * D, D);
      }
      // A short last block: the tile's keys past it score 0 and are masked below.
      std::fill(keys.begin() + tokens * D, keys.begin() + tokens4 * D, 0.0f);
      int64_t n = 0;
      for (; n + 2 <= heads; n += 2) {
        for (int64_t t = 0; t < tokens4; t += 4) {
          score_tile<D, 2>(qh.data() + n * D, keys.data(), probs.data() + n * padded, padded, t);
        }
      }
      if (n < heads) {
        for (int64_t t = 0; t < tokens4; t += 4) {
          score_tile<D, 1>(qh.data() + n * D, keys.data(), probs.data() + n * padded, padded, t);
        }
      }
      auto visible = [&](int64_t n) {
        const int64_t to = first_row_keys + n / group - start;
        return VisibleKeys{to - window, to};  // `from` is read only with a window
      };
      if (window > 0) {
        softmax_heads<true>(probs.data(), padded, heads, tokens, visible, st.run_max, st.run_sum,
                            corr.data(), new_max.data());
      } else {
        softmax_heads<false>(probs.data(), padded, heads, tokens, visible, st.run_max,
                             st.run_sum, corr.data(), new_max.data());
      }
      for (int64_t c0 = 0; c0 < D; c0 += 32) {
        for (n = 0; n + 2 <= heads; n += 2) {
          value_tile<D, 2>(probs.data() + n * padded, vals.data(), corr.data() + n,
                           st.acc + n * D, padded, tokens, c0);
        }
        if (n < heads) {
          value_tile<D, 1>(probs.data() + n * padded, vals.data(), corr.data() + n,
                           st.acc + n * D, padded, tokens, c0);
        }
      }
      start += tokens;
    });
  }, [&](int64_t h, int64_t n) { return sinks ? sinks + h * group + n % group : nullptr; },
  [&](int64_t h, int64_t n, const float* acc, float inv) {
    T* dst = out + ((n / group) * num_q_heads + h * group + n % group) * D;
    for (int64_t i = 0; i < D; ++i) dst[i] = static_cast<T>(acc[i] * inv);
  });
}

template <typename T>
void run_chunk(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_table, int64_t seq_len, int64_t window,
               const float* sinks, at::Tensor& out, float scale) {
  with_cache_type(k_cache.scalar_type(), [&](auto cache_tag) {
    using C = decltype(cache_tag);
    if constexpr (readable_pair<T, C>() && !std::is_same_v<T, double>) {
      auto kernel = q.size(2) == 64 ? chunk_attention<T, C, 64> : chunk_attention<T, C, 128>;
      kernel(q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(),
             block_table.data_ptr<int64_t>(), seq_len, window, sinks, out.data_ptr<T>(),
             q.size(0), q.size(1), k_cache.size(2), k_cache.size(1), scale);
    }
  });
}
#endif

}  // namespace

// See entry_points.h.
at::Tensor paged_chunk_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                    at::Tensor block_table, int64_t seq_len, double scale,
                                    int64_t window, c10::optional<at::Tensor> sinks) {
  check_paged_inputs(q, k_cache, v_cache);
  TORCH_CHECK(block_table.dim() == 1 && block_table.scalar_type() == at::kLong,
              "block_table must be one int64 row");
  const int64_t rows = q.size(0), block_size = k_cache.size(1);
  TORCH_CHECK(rows >= 1 && rows <= seq_len, "a chunk has 1 to seq_len rows");
  TORCH_CHECK(block_table.size(0) * block_size >= seq_len, "block_table is too short for seq_len");
  TORCH_CHECK(window >= 0, "window must be 0 (none) or a number of keys");
#ifdef OFFICELLM_CHUNK_KERNEL
  const auto q_type = q.scalar_type();
  if ((q.size(2) == 64 || q.size(2) == 128) &&
      (q_type == at::kFloat || q_type == at::kBFloat16 || q_type == at::kHalf)) {
    q = q.contiguous();
    block_table = block_table.contiguous();
    auto out = at::empty_like(q);
    const at::Tensor sink_logits = checked_sinks(sinks, q.size(1));
    const float* sink_ptr = sink_logits.defined() ? sink_logits.data_ptr<float>() : nullptr;
    OFFICELLM_DISPATCH_QUERY_TYPES(q_type, "paged_chunk_attention", [&] {
      run_chunk<scalar_t>(q, k_cache, v_cache, block_table, seq_len, window, sink_ptr, out,
                          static_cast<float>(scale));
    });
    return out;
  }
#endif
  // Row by row through the decode kernel, each row a sequence of its own causal length.
  auto tables = block_table.unsqueeze(0).expand({rows, -1}).contiguous();
  auto lens = at::arange(seq_len - rows + 1, seq_len + 1, block_table.options());
  return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, window, sinks);
}

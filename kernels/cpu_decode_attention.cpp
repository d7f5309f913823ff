// Paged attention for the CPU, keys and values read straight from the paged cache through the
// block table: decodes (one query token per sequence) and, further down, a prompt chunk's
// rows over their cached history (paged_chunk_attention).
//
// Why not gather + SDPA: gathering each sequence's keys into a padded [B, L] tensor writes and
// re-reads the whole context every layer of every step; at office context lengths the KV
// cache is bigger than the weights, so that triples the step's dominant memory traffic.
// Here each sequence streams its blocks once, with an online softmax, and the query heads of
// a GQA group share every key and value row they load. A block is walked whole (all its KV
// heads, one contiguous run of memory) while the next one is prefetched a few lines at a
// time: the KV cache comes from DRAM, and at SmolLM2's shape (16 sequences of 800 tokens, 30
// layers, 2 threads on a Zen 4) this took a step's decode attention from 38.6 ms (one
// (sequence, KV head) pair at a time, the next block prefetched in one burst) to 15.2 ms,
// 7.6 -> 19.4 GB/s.
//
// Built on first use by kernels/cpu_kernels.py (torch.utils.cpp_extension, one build per ISA
// level chosen at run time).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX2__) || defined(__F16C__) || (defined(__AVX512F__) && defined(__AVX512BF16__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define OFFICELLM_AVX512_BF16 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }

inline float to_float(double x) { return static_cast<float>(x); }

inline float to_float(at::BFloat16 x) {
  // bf16 is the top half of an fp32: a shift, which the compiler vectorizes.
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float to_float(at::Half x) { return static_cast<float>(x); }

// fp8 caches (--kv-cache-dtype fp8_e4m3 / fp8_e5m2): c10's exact scalar conversions; the
// rows of a cache are converted 8 at a time below where F16C is available.
inline float to_float(at::Float8_e4m3fn x) { return static_cast<float>(x); }

inline float to_float(at::Float8_e5m2 x) { return static_cast<float>(x); }

template <typename T>
inline void load_row(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

// An int8 cache row (--kv-cache-dtype int8) is n values, then their float32 scale
// (kernels/reference.py: quantize_int8_rows); the loop vectorizes on every level.
template <>
inline void load_row(const int8_t* src, float* dst, int64_t n) {
  float scale;
  std::memcpy(&scale, src + n, sizeof scale);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}

// Elements of one (token, KV head) row of a cache of type C: its values, plus int8's scale.
template <typename C>
constexpr int64_t row_extra() {
  return std::is_same_v<C, int8_t> ? 4 : 0;
}

#if defined(__F16C__)
// at::Half's scalar conversion does not vectorize: 8 at a time with F16C's vcvtph2ps (2.8x
// faster for a float16 KV cache than the scalar loop, measured on SmolLM2's shapes: 16
// sequences of 1,024 tokens, 1.6 ms a layer call, as fast as a float32 cache).
template <>
inline void load_row(const at::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

// e5m2 is the top byte of an IEEE half: shift each byte up 8 bits, then vcvtph2ps. Exact.
template <>
inline void load_row(const at::Float8_e5m2* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    const __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8);
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

// e4m3 (bias 7) laid into a half's fields (bias 15): sign to bit 15, exponent and mantissa
// shifted up 7, which reads as the value times 2^-8 (subnormals included, as halves);
// times 256 restores it exactly. Only the NaN pattern (never stored: writes saturate at
// 448) would read as a number.
template <>
inline void load_row(const at::Float8_e4m3fn* src, float* dst, int64_t n) {
  const __m128i sign_mask = _mm_set1_epi16(0x80);
  const __m128i magnitude_mask = _mm_set1_epi16(0x7F);
  const __m256 two_to_8 = _mm256_set1_ps(256.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bytes = _mm_cvtepu8_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(bytes, sign_mask), 8),
                                   _mm_slli_epi16(_mm_and_si128(bytes, magnitude_mask), 7));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), two_to_8));
  }
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}
#endif

// Calls run(C{}) with the cache's element type.
template <typename Run>
void with_cache_type(at::ScalarType cache_type, Run&& run) {
  switch (cache_type) {
    case at::kDouble: return run(double{});
    case at::kFloat: return run(float{});
    case at::kBFloat16: return run(at::BFloat16{});
    case at::kHalf: return run(at::Half{});
    case at::kFloat8_e4m3fn: return run(at::Float8_e4m3fn{});
    case at::kFloat8_e5m2: return run(at::Float8_e5m2{});
    case at::kChar: return run(int8_t{});
    default: TORCH_CHECK(false, "no paged attention over a ", cache_type, " cache");
  }
}

// The cache types a query of type T may read: its own; bf16/fp16 under a float32 query
// (--kv-cache-dtype float16 under a float32 model); fp8 (e4m3, e5m2) and int8 under any.
template <typename T, typename C>
constexpr bool readable_pair() {
  constexpr bool one_byte = std::is_same_v<C, at::Float8_e4m3fn> ||
                            std::is_same_v<C, at::Float8_e5m2> || std::is_same_v<C, int8_t>;
  constexpr bool sixteen_under_float = std::is_same_v<T, float> &&
      (std::is_same_v<C, at::BFloat16> || std::is_same_v<C, at::Half>);
  return std::is_same_v<T, C> || one_byte || sixteen_under_float;
}

constexpr const char* kCachePairs =
    "q and the caches must share a dtype (or the caches be bf16/fp16 under a float32 q, or "
    "fp8/int8)";

// Prefetches a block's K and V rows a few lines at a time, spread over the work on the block
// before it: blocks lie anywhere in the pool, so the hardware's stream prefetch stops at each
// block's end, and a burst of a whole block's prefetches (192 lines at SmolLM2's shape)
// stalls the core once its miss buffers are full.
class Prefetcher {
 public:
  // steps: how many times the body will call step() while working on the current block.
  Prefetcher(const void* k, const void* v, int64_t bytes, int64_t steps)
      : k_(static_cast<const char*>(k)), v_(static_cast<const char*>(v)), bytes_(bytes),
        stride_(64 * std::max<int64_t>(
                         1, (bytes / 64 + steps - 1) / std::max<int64_t>(1, steps))) {}

  inline void step() {
    for (int64_t end = std::min(bytes_, at_ + stride_); at_ < end; at_ += 64) {
      __builtin_prefetch(k_ + at_);
      __builtin_prefetch(v_ + at_);
    }
  }

  // Whatever the steps did not reach (a body that took fewer steps than it said).
  inline void finish() {
    while (at_ < bytes_) step();
  }

 private:
  const char* k_;
  const char* v_;
  int64_t bytes_;
  int64_t stride_;
  int64_t at_ = 0;
};

// Calls body(k block, v block, tokens, prefetcher) for blocks [first, end) of one sequence
// of n tokens, in order; a block's pointer is its first token's first KV head, and its rows
// for every KV head follow one another (one contiguous run of tokens x token_elems). The
// body calls the prefetcher's step() steps_per_token times per token of its block, which
// fetches the next block in time.
template <typename C, typename Body>
inline void walk_blocks(const C* k_cache, const C* v_cache, const int64_t* table, int64_t first,
                        int64_t end, int64_t n, int64_t block_size, int64_t token_elems,
                        int64_t steps_per_token, Body&& body) {
  const int64_t block_elems = block_size * token_elems;
  auto tokens = [&](int64_t blk) { return std::min(block_size, n - blk * block_size); };
  for (int64_t blk = first; blk < end; ++blk) {
    const int64_t next = blk + 1 < end ? table[blk + 1] * block_elems : 0;
    const int64_t next_bytes =
        blk + 1 < end ? tokens(blk + 1) * token_elems * static_cast<int64_t>(sizeof(C)) : 0;
    Prefetcher prefetcher(k_cache + next, v_cache + next, next_bytes,
                          tokens(blk) * steps_per_token);
    body(k_cache + table[blk] * block_elems, v_cache + table[blk] * block_elems, tokens(blk),
         prefetcher);
    prefetcher.finish();
  }
}

// The context of one sequence is cut into parts of min_part_blocks blocks or more
// (kMinPartBlocks for a decode: one query row a sequence), so that one long sequence (the
// desk case: one user) still gives every thread work; each part is
// attended on its own and the parts are merged by their softmax maxima and sums at the end.
// Items are taken longest first from a shared counter, so threads that drew short contexts
// take more of them instead of waiting at the barrier for the one that drew the longest.
constexpr int64_t kMinPartBlocks = 8;

// The per-item state: one accumulator row, running max and sum per query head.
struct PartState {
  float* acc;      // [num_q_heads, d], not yet divided by the sum
  float* run_max;  // [num_q_heads]
  float* run_sum;  // [num_q_heads]
};

// attend(b, first_block, end_block, state) runs the online softmax over those blocks of
// sequence b for every query head, starting from the state as given (zero acc and sum, max
// -1e30); store(b, q_head, acc_row, inv_sum) writes one output row.
template <typename Attend, typename Store>
void over_context_parts(int64_t num_seqs, const int64_t* seq_lens, int64_t block_size,
                        int64_t num_q_heads, int64_t d, int64_t min_part_blocks,
                        Attend&& attend, Store&& store) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> blocks(num_seqs), parts(num_seqs), first_part(num_seqs + 1, 0);
  int64_t total_blocks = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    blocks[b] = (seq_lens[b] + block_size - 1) / block_size;
    total_blocks += blocks[b];
  }
  const int64_t part_blocks = std::max(min_part_blocks, total_blocks / (4 * threads));
  for (int64_t b = 0; b < num_seqs; ++b) {
    parts[b] = std::max<int64_t>(1, blocks[b] / part_blocks);
    first_part[b + 1] = first_part[b] + parts[b];
  }
  const int64_t num_items = first_part[num_seqs];
  // Longest parts first (largest-first scheduling balances the threads' totals).
  std::vector<int64_t> order(num_items), item_seq(num_items);
  for (int64_t b = 0; b < num_seqs; ++b) {
    for (int64_t p = first_part[b]; p < first_part[b + 1]; ++p) item_seq[p] = b;
  }
  for (int64_t i = 0; i < num_items; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return blocks[item_seq[x]] / parts[item_seq[x]] > blocks[item_seq[y]] / parts[item_seq[y]];
  });
  const int64_t row = num_q_heads * d;
  // Maxima start finite, not -inf: the kernels are built with -ffast-math (vectorized exp),
  // which assumes no infinities; exp(-1e30 - max) is still exactly 0.
  std::vector<float> acc(num_items * row, 0.0f), run_max(num_items * num_q_heads, -1e30f),
      run_sum(num_items * num_q_heads, 0.0f);
  // Parts of a sequence still running; whoever finishes its last part merges and stores it.
  std::unique_ptr<std::atomic<int64_t>[]> pending(new std::atomic<int64_t>[num_seqs]);
  for (int64_t b = 0; b < num_seqs; ++b) pending[b].store(parts[b]);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
      const int64_t item = order[i], b = item_seq[item], p = item - first_part[b];
      const int64_t first = blocks[b] * p / parts[b], end = blocks[b] * (p + 1) / parts[b];
      attend(b, first, end, PartState{acc.data() + item * row,
                                      run_max.data() + item * num_q_heads,
                                      run_sum.data() + item * num_q_heads});
      if (pending[b].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      const int64_t p0 = first_part[b];
      for (int64_t hq = 0; hq < num_q_heads; ++hq) {
        float top = -1e30f;
        for (int64_t p2 = p0; p2 < first_part[b + 1]; ++p2) {
          top = std::max(top, run_max[p2 * num_q_heads + hq]);
        }
        float* merged = acc.data() + p0 * row + hq * d;
        float sum = 0.0f;
        for (int64_t p2 = p0; p2 < first_part[b + 1]; ++p2) {
          const float w = std::exp(run_max[p2 * num_q_heads + hq] - top);
          sum += run_sum[p2 * num_q_heads + hq] * w;
          const float* part = acc.data() + p2 * row + hq * d;
          if (p2 == p0) {
            for (int64_t i2 = 0; i2 < d; ++i2) merged[i2] = part[i2] * w;
          } else {
            for (int64_t i2 = 0; i2 < d; ++i2) merged[i2] += part[i2] * w;
          }
        }
        store(b, hq, merged, sum > 0.0f ? 1.0f / sum : 0.0f);
      }
    }
  });
}

// One block of the online softmax, shared by every kernel: turns the block's scores p[0,
// tokens) into exp(score - new running max) in place, folds their sum into run_sum, and calls
// rescale(correction) so the caller can shrink what it accumulated under the old max (the
// accumulators live in a float array in one kernel, in vector registers in the other).
template <typename Rescale>
inline void online_softmax_block(float* p, int64_t tokens, float& run_max, float& run_sum,
                                 Rescale&& rescale) {
  float block_max = p[0];
  for (int64_t t = 1; t < tokens; ++t) block_max = std::max(block_max, p[t]);
  const float new_max = std::max(run_max, block_max);
  const float correction = std::exp(run_max - new_max);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < tokens; ++t) {
    p[t] = std::exp(p[t] - new_max);
    sum += p[t];
  }
  run_sum = run_sum * correction + sum;
  run_max = new_max;
  rescale(correction);
}

// HEAD_DIM > 0 fixes the head size at compile time (fully unrolled, register-resident
// rows); 0 reads it from head_dim.
// T is the query's (and output's) type, C the cache's: a float32 model may keep its KV cache
// in 16 bits, any model in fp8 (--kv-cache-dtype), converted to float on load (F16C, a
// shift for bf16, the byte laid into a half for fp8).
template <typename T, typename C, int64_t HEAD_DIM>
void decode_attention(const T* q, const C* k_cache, const C* v_cache, const int64_t* block_tables,
                      const int64_t* seq_lens, T* out, int64_t num_seqs, int64_t num_q_heads,
                      int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                      int64_t table_width, float scale) {
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t d = HEAD_DIM > 0 ? HEAD_DIM : head_dim;
  const int64_t row_elems = d + row_extra<C>();
  // Stride between consecutive tokens of one KV head inside a block.
  const int64_t token_stride = num_kv_heads * row_elems;
  over_context_parts(num_seqs, seq_lens, block_size, num_q_heads, d, kMinPartBlocks,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    std::vector<float> qf(num_q_heads * d), row(d), probs(group * block_size);
    for (int64_t i = 0; i < num_q_heads * d; ++i) qf[i] = to_float(q[b * num_q_heads * d + i]) * scale;
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                block_size, token_stride, 2 * num_kv_heads,
                [&](const C* k_block, const C* v_block, int64_t tokens, Prefetcher& prefetcher) {
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const C* k_base = k_block + h * row_elems;
        const C* v_base = v_block + h * row_elems;
        // Scores of this block's keys for every query head of the group.
        for (int64_t t = 0; t < tokens; ++t) {
          prefetcher.step();
          load_row(k_base + t * token_stride, row.data(), d);
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = qf.data() + (h * group + g) * d;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < d; ++i) s += qg[i] * row[i];
            probs[g * block_size + t] = s;
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          float* a = st.acc + (h * group + g) * d;
          online_softmax_block(probs.data() + g * block_size, tokens, st.run_max[h * group + g],
                               st.run_sum[h * group + g], [&](float correction) {
                                 for (int64_t i = 0; i < d; ++i) a[i] *= correction;
                               });
        }
        for (int64_t t = 0; t < tokens; ++t) {
          prefetcher.step();
          load_row(v_base + t * token_stride, row.data(), d);
          for (int64_t g = 0; g < group; ++g) {
            const float p = probs[g * block_size + t];
            float* a = st.acc + (h * group + g) * d;
            for (int64_t i = 0; i < d; ++i) a[i] += p * row[i];
          }
        }
      }
    });
  }, [&](int64_t b, int64_t hq, const float* acc, float inv) {
    T* dst = out + (b * num_q_heads + hq) * d;
    for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(acc[i] * inv);
  });
}

#ifdef OFFICELLM_AVX512_BF16
// bf16 on CPUs with AVX512-BF16 (Zen 4, Sapphire Rapids): q.k with vdpbf16ps straight on the
// stored bf16 (products of bf16 are exact in fp32, sums in fp32), p.v with fp32 FMAs into
// accumulators that stay in registers (G query heads x D/16 vectors).
template <int64_t D, int64_t G>
void decode_attention_avx512_bf16(const at::BFloat16* q, const at::BFloat16* k_cache,
                                  const at::BFloat16* v_cache, const int64_t* block_tables,
                                  const int64_t* seq_lens, at::BFloat16* out, int64_t num_seqs,
                                  int64_t num_q_heads, int64_t num_kv_heads, int64_t block_size,
                                  int64_t table_width, float scale) {
  constexpr int64_t kPairs = D / 32;  // 512-bit vectors of bf16 per row
  constexpr int64_t kVecs = D / 16;   // 512-bit vectors of fp32 per row
  const int64_t token_stride = num_kv_heads * D;
  over_context_parts(num_seqs, seq_lens, block_size, num_q_heads, D, kMinPartBlocks,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    std::vector<float> probs(G * block_size);
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                block_size, token_stride, 2 * num_kv_heads,
                [&](const at::BFloat16* k_block, const at::BFloat16* v_block, int64_t tokens,
                    Prefetcher& prefetcher) {
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const at::BFloat16* k_base = k_block + h * D;
        const at::BFloat16* v_base = v_block + h * D;
        float* run_max = st.run_max + h * G;
        float* run_sum = st.run_sum + h * G;
        __m512bh qv[G][kPairs];
        __m512 acc[G][kVecs];
        for (int64_t g = 0; g < G; ++g) {
          const at::BFloat16* src = q + (b * num_q_heads + h * G + g) * D;
          for (int64_t p = 0; p < kPairs; ++p) {
            qv[g][p] = (__m512bh)_mm512_loadu_si512(src + p * 32);
          }
          for (int64_t v = 0; v < kVecs; ++v) {
            acc[g][v] = _mm512_loadu_ps(st.acc + (h * G + g) * D + v * 16);
          }
        }
        for (int64_t t = 0; t < tokens; ++t) {
          prefetcher.step();
          const at::BFloat16* kr = k_base + t * token_stride;
          __m512bh kv[kPairs];
          for (int64_t p = 0; p < kPairs; ++p) kv[p] = (__m512bh)_mm512_loadu_si512(kr + p * 32);
          for (int64_t g = 0; g < G; ++g) {
            __m512 dot = _mm512_setzero_ps();
            for (int64_t p = 0; p < kPairs; ++p) dot = _mm512_dpbf16_ps(dot, qv[g][p], kv[p]);
            probs[g * block_size + t] = _mm512_reduce_add_ps(dot) * scale;
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          online_softmax_block(probs.data() + g * block_size, tokens, run_max[g], run_sum[g],
                               [&](float correction) {
                                 const __m512 c = _mm512_set1_ps(correction);
                                 for (int64_t v = 0; v < kVecs; ++v) {
                                   acc[g][v] = _mm512_mul_ps(acc[g][v], c);
                                 }
                               });
        }
        for (int64_t t = 0; t < tokens; ++t) {
          prefetcher.step();
          const at::BFloat16* vr = v_base + t * token_stride;
          __m512 vf[kVecs];
          for (int64_t v = 0; v < kVecs; ++v) {
            vf[v] = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(vr + v * 16)));
          }
          for (int64_t g = 0; g < G; ++g) {
            const __m512 p = _mm512_set1_ps(probs[g * block_size + t]);
            for (int64_t v = 0; v < kVecs; ++v) acc[g][v] = _mm512_fmadd_ps(p, vf[v], acc[g][v]);
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t v = 0; v < kVecs; ++v) {
            _mm512_storeu_ps(st.acc + (h * G + g) * D + v * 16, acc[g][v]);
          }
        }
      }
    });
  }, [&](int64_t b, int64_t hq, const float* acc, float inv) {
    at::BFloat16* dst = out + (b * num_q_heads + hq) * D;
    const __m512 scale_by = _mm512_set1_ps(inv);
    for (int64_t v = 0; v < kVecs; ++v) {
      // Round to nearest even, as torch's float -> bf16 does.
      __m256bh r = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(acc + v * 16), scale_by));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + v * 16), (__m256i)r);
    }
  });
}

// The bf16 fast path for this shape, or nullptr when there is none.
using Bf16Kernel = void (*)(const at::BFloat16*, const at::BFloat16*, const at::BFloat16*,
                            const int64_t*, const int64_t*, at::BFloat16*, int64_t, int64_t,
                            int64_t, int64_t, int64_t, float);

template <int64_t D>
Bf16Kernel pick_for_group(int64_t group) {
  switch (group) {
    case 1: return decode_attention_avx512_bf16<D, 1>;
    case 2: return decode_attention_avx512_bf16<D, 2>;
    case 3: return decode_attention_avx512_bf16<D, 3>;
    case 4: return decode_attention_avx512_bf16<D, 4>;
    case 5: return decode_attention_avx512_bf16<D, 5>;
    case 6: return decode_attention_avx512_bf16<D, 6>;
    case 7: return decode_attention_avx512_bf16<D, 7>;
    case 8: return decode_attention_avx512_bf16<D, 8>;
    default: return nullptr;
  }
}

Bf16Kernel pick_bf16_kernel(int64_t head_dim, int64_t group) {
  if (head_dim == 64) return pick_for_group<64>(group);
  if (head_dim == 128) return pick_for_group<128>(group);
  return nullptr;
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define OFFICELLM_AVX2_F32Q 1
// A float32 model's decode over its 16-bit cache (the CPU's `--kv-cache-dtype auto` on every
// CPU without bf16 instructions): the generic kernel above goes through a float row and
// accumulators in memory, ~120 cycles per (token, KV head) at SmolLM2's shape, and at office
// context lengths this is half of a decode step. Here each stored row is converted straight
// into registers and fed to FMAs against the group's query heads (G x D/8 FMAs a row for q.k,
// as many for p.v), the group's scores reduced with horizontal adds four heads at a time.
inline __m256 load8(const at::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The sums of 4 vectors' lanes, one float each.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// The most vectors of a row (a divisor of the row's kVecs) whose G x chunk accumulators fit
// in 12 of AVX2's 16 registers, leaving room for the row's vectors and a probability.
constexpr int64_t chunk_vectors(int64_t vecs, int64_t group) {
  int64_t chunk = 1;
  for (int64_t c = 1; c <= vecs; ++c) {
    if (vecs % c == 0 && c * group <= 12) chunk = c;
  }
  return chunk;
}

template <typename C, int64_t D, int64_t G>
void decode_attention_avx2(const float* q, const C* k_cache, const C* v_cache,
                           const int64_t* block_tables, const int64_t* seq_lens, float* out,
                           int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t block_size, int64_t table_width, float scale) {
  constexpr int64_t kVecs = D / 8;
  // p.v in chunks of kChunk vectors, G x kChunk accumulators held in registers (16 on AVX2).
  constexpr int64_t kChunk = chunk_vectors(kVecs, G);
  constexpr int64_t kGroups4 = (G + 3) / 4;
  const int64_t token_stride = num_kv_heads * D;
  over_context_parts(num_seqs, seq_lens, block_size, num_q_heads, D, kMinPartBlocks,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    std::vector<float> qf(num_q_heads * D), probs(G * block_size);
    for (int64_t i = 0; i < num_q_heads * D; ++i) qf[i] = q[b * num_q_heads * D + i] * scale;
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                block_size, token_stride, 2 * num_kv_heads,
                [&](const C* k_block, const C* v_block, int64_t tokens, Prefetcher& prefetcher) {
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const C* k_base = k_block + h * D;
        const C* v_base = v_block + h * D;
        const float* qh = qf.data() + h * G * D;
        float* acc = st.acc + h * G * D;
        for (int64_t t = 0; t < tokens; ++t) {
          prefetcher.step();
          const C* kr = k_base + t * token_stride;
          __m256 s[kGroups4 * 4];
          for (int64_t g = 0; g < kGroups4 * 4; ++g) s[g] = _mm256_setzero_ps();
          for (int64_t v = 0; v < kVecs; ++v) {
            const __m256 kv = load8(kr + v * 8);
            for (int64_t g = 0; g < G; ++g) {
              s[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * D + v * 8), kv, s[g]);
            }
          }
          for (int64_t g4 = 0; g4 < kGroups4; ++g4) {
            alignas(16) float four[4];
            _mm_store_ps(four, hsum4(s[4 * g4], s[4 * g4 + 1], s[4 * g4 + 2], s[4 * g4 + 3]));
            for (int64_t j = 0; j < 4 && 4 * g4 + j < G; ++j) {
              probs[(4 * g4 + j) * block_size + t] = four[j];
            }
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          online_softmax_block(probs.data() + g * block_size, tokens, st.run_max[h * G + g],
                               st.run_sum[h * G + g], [&](float correction) {
                                 const __m256 c = _mm256_set1_ps(correction);
                                 for (int64_t v = 0; v < kVecs; ++v) {
                                   float* a = acc + g * D + v * 8;
                                   _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_loadu_ps(a), c));
                                 }
                               });
        }
        for (int64_t c0 = 0; c0 < kVecs; c0 += kChunk) {
          __m256 a[G][kChunk];
          for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < kChunk; ++j) a[g][j] = _mm256_loadu_ps(acc + g * D + (c0 + j) * 8);
          for (int64_t t = 0; t < tokens; ++t) {
            if (c0 == 0) prefetcher.step();
            const C* vr = v_base + t * token_stride + c0 * 8;
            __m256 vv[kChunk];
            for (int64_t j = 0; j < kChunk; ++j) vv[j] = load8(vr + j * 8);
            for (int64_t g = 0; g < G; ++g) {
              const __m256 p = _mm256_broadcast_ss(&probs[g * block_size + t]);
              for (int64_t j = 0; j < kChunk; ++j) a[g][j] = _mm256_fmadd_ps(p, vv[j], a[g][j]);
            }
          }
          for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < kChunk; ++j) _mm256_storeu_ps(acc + g * D + (c0 + j) * 8, a[g][j]);
        }
      }
    });
  }, [&](int64_t b, int64_t hq, const float* acc, float inv) {
    float* dst = out + (b * num_q_heads + hq) * D;
    const __m256 scale_by = _mm256_set1_ps(inv);
    for (int64_t v = 0; v < kVecs; ++v) {
      _mm256_storeu_ps(dst + v * 8, _mm256_mul_ps(_mm256_loadu_ps(acc + v * 8), scale_by));
    }
  });
}

template <typename C>
using Avx2Kernel = void (*)(const float*, const C*, const C*, const int64_t*, const int64_t*,
                            float*, int64_t, int64_t, int64_t, int64_t, int64_t, float);

template <typename C, int64_t D>
Avx2Kernel<C> pick_avx2_for_group(int64_t group) {
  switch (group) {
    case 1: return decode_attention_avx2<C, D, 1>;
    case 2: return decode_attention_avx2<C, D, 2>;
    case 3: return decode_attention_avx2<C, D, 3>;
    case 4: return decode_attention_avx2<C, D, 4>;
    case 5: return decode_attention_avx2<C, D, 5>;
    case 6: return decode_attention_avx2<C, D, 6>;
    case 7: return decode_attention_avx2<C, D, 7>;
    case 8: return decode_attention_avx2<C, D, 8>;
    default: return nullptr;
  }
}

// The AVX2 kernel for a float32 query over a 16-bit cache of this shape, or nullptr.
template <typename C>
Avx2Kernel<C> pick_avx2_kernel(int64_t head_dim, int64_t group) {
  if (head_dim == 64) return pick_avx2_for_group<C, 64>(group);
  if (head_dim == 128) return pick_avx2_for_group<C, 128>(group);
  return nullptr;
}
#endif

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
// p[n * stride, + tokens), of which it sees the first visible(n) (0 to all; its later
// lanes, up to the next multiple of 8, are written as 0). Heads are independent, so each
// step runs over all of them before the next (the exps' dependency chains overlap instead
// of stalling head by head), and the corrections are taken 8 heads at a time. corr gets
// each head's correction (room for heads rounded up to 8); new_max is scratch (heads).
template <typename Visible>
inline void softmax_heads(float* p, int64_t stride, int64_t heads, int64_t tokens,
                          Visible&& visible, float* run_max, float* run_sum, float* corr,
                          float* new_max) {
  const int64_t heads8 = (heads + 7) / 8 * 8;
  float* shrink = corr;
  for (int64_t n = 0; n < heads; ++n) {
    const int64_t seen = visible(n);
    __m256 m = _mm256_set1_ps(-1e30f);
    for (int64_t t = 0; t < tokens; t += 8) {
      m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-1e30f), _mm256_loadu_ps(p + n * stride + t),
                                            _mm256_castsi256_ps(first_lanes(seen - t))));
    }
    new_max[n] = std::max(run_max[n], hmax8(m));
    shrink[n] = run_max[n] - new_max[n];
  }
  for (int64_t n = 0; n < heads8; n += 8) {
    _mm256_storeu_ps(shrink + n, exp_nonpositive(_mm256_loadu_ps(shrink + n)));
  }
  for (int64_t n = 0; n < heads; ++n) {
    const int64_t seen = visible(n);
    const __m256 shift = _mm256_set1_ps(new_max[n]);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < tokens; t += 8) {
      float* at = p + n * stride + t;
      const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(at), shift)),
                                     _mm256_castsi256_ps(first_lanes(seen - t)));
      _mm256_storeu_ps(at, e);
      sum = _mm256_add_ps(sum, e);
    }
    run_sum[n] = run_sum[n] * shrink[n] + hsum8(sum);
    run_max[n] = new_max[n];
  }
}

// T is the query's (and output's) type, C the cache's (any the decode kernel reads).
template <typename T, typename C, int64_t D>
void chunk_attention(const T* q, const C* k_cache, const C* v_cache, const int64_t* table,
                     int64_t seq_len, T* out, int64_t rows, int64_t num_q_heads,
                     int64_t num_kv_heads, int64_t block_size, float scale) {
  static_assert(D % 32 == 0, "value tiles are 32 wide");
  const int64_t group = num_q_heads / num_kv_heads;
  // The query heads of one KV head: every row's group, row-major (row, head in group).
  const int64_t heads = rows * group;
  const int64_t row_elems = D + row_extra<C>();
  const int64_t token_stride = num_kv_heads * row_elems;
  const int64_t padded = (block_size + 7) / 8 * 8;
  const int64_t first_row_keys = seq_len - rows + 1;
  // Each KV head is an item of its own (as a sequence would be to the decode kernel), so a
  // short history still gives every thread work.
  const std::vector<int64_t> seq_lens(num_kv_heads, seq_len);
  over_context_parts(num_kv_heads, seq_lens.data(), block_size, heads, D, kMinChunkPartBlocks,
                     [&](int64_t h, int64_t first, int64_t end, PartState st) {
    std::vector<float> qh(heads * D), keys(padded * D, 0.0f), vals(block_size * D),
        probs(heads * padded), corr((heads + 7) / 8 * 8, 0.0f), new_max(heads);
    for (int64_t n = 0; n < heads; ++n) {
      const T* src = q + ((n / group) * num_q_heads + h * group + n % group) * D;
      for (int64_t i = 0; i < D; ++i) qh[n * D + i] = to_float(src[i]) * scale;
    }
    int64_t start = first * block_size;  // the position of the block's first key
    walk_blocks(k_cache + h * row_elems, v_cache + h * row_elems, table, first, end, seq_len,
                block_size, token_stride, 2,
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
      softmax_heads(probs.data(), padded, heads, tokens,
                    [&](int64_t n) { return first_row_keys + n / group - start; }, st.run_max,
                    st.run_sum, corr.data(), new_max.data());
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
  }, [&](int64_t h, int64_t n, const float* acc, float inv) {
    T* dst = out + ((n / group) * num_q_heads + h * group + n % group) * D;
    for (int64_t i = 0; i < D; ++i) dst[i] = static_cast<T>(acc[i] * inv);
  });
}

template <typename T>
void run_chunk(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
               const torch::Tensor& block_table, int64_t seq_len, torch::Tensor& out,
               float scale) {
  with_cache_type(k_cache.scalar_type(), [&](auto cache_tag) {
    using C = decltype(cache_tag);
    if constexpr (readable_pair<T, C>() && !std::is_same_v<T, double>) {
      auto kernel = q.size(2) == 64 ? chunk_attention<T, C, 64> : chunk_attention<T, C, 128>;
      kernel(q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(),
             block_table.data_ptr<int64_t>(), seq_len, out.data_ptr<T>(), q.size(0), q.size(1),
             k_cache.size(2), k_cache.size(1), scale);
    }
  });
}
#endif

// The kernel for a query type T and a cache type C, by head size.
template <typename T, typename C>
void run_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                const torch::Tensor& block_tables, const torch::Tensor& seq_lens, torch::Tensor& out,
                float scale) {
  const int64_t num_seqs = q.size(0), num_q_heads = q.size(1), head_dim = q.size(2);
  auto run = [&](auto kernel) {
    kernel(q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(),
           block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), out.data_ptr<T>(),
           num_seqs, num_q_heads, k_cache.size(2), head_dim, k_cache.size(1),
           block_tables.size(1), scale);
  };
  if (head_dim == 64) {
    run(decode_attention<T, C, 64>);
  } else if (head_dim == 128) {
    run(decode_attention<T, C, 128>);
  } else {
    run(decode_attention<T, C, 0>);
  }
}

// A float32 query over a 16-bit cache C: the AVX2 kernel where the build has it and the
// shape is one of its own, else the generic one.
template <typename C>
void run_decode_f32_query(const torch::Tensor& q, const torch::Tensor& k_cache,
                          const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                          const torch::Tensor& seq_lens, torch::Tensor& out, float scale) {
#ifdef OFFICELLM_AVX2_F32Q
  const int64_t num_q_heads = q.size(1), num_kv_heads = k_cache.size(2);
  if (Avx2Kernel<C> kernel = pick_avx2_kernel<C>(q.size(2), num_q_heads / num_kv_heads)) {
    kernel(q.data_ptr<float>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(),
           block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), out.data_ptr<float>(),
           q.size(0), num_q_heads, num_kv_heads, k_cache.size(1), block_tables.size(1), scale);
    return;
  }
#endif
  run_decode<float, C>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
}

// The checks both entry points make of q [rows, Hq, D] and the paged caches.
void check_paged_inputs(const torch::Tensor& q, const torch::Tensor& k_cache,
                        const torch::Tensor& v_cache) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4, "bad ranks");
  TORCH_CHECK(q.device().is_cpu(), "CPU tensors only");
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(v_cache.scalar_type() == cache_type, "the K and V caches must share a dtype");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(k_cache.size(3) == q.size(2) + (cache_type == at::kChar ? 4 : 0) &&
                  v_cache.size(3) == k_cache.size(3),
              "head_dim mismatch (an int8 cache's rows are head_dim + 4 bytes)");
  bool readable = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    with_cache_type(cache_type, [&](auto cache_tag) {
      readable = readable_pair<scalar_t, decltype(cache_tag)>();
    });
  });
  TORCH_CHECK(readable, kCachePairs);
}

template <typename T>
void dispatch_cache(at::ScalarType cache_type, const torch::Tensor& q,
                    const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                    const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                    torch::Tensor& out, float scale) {
  if (cache_type == q.scalar_type()) {
    run_decode<T, T>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
  } else if (cache_type == at::kFloat8_e4m3fn) {
    run_decode<T, at::Float8_e4m3fn>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
  } else if (cache_type == at::kFloat8_e5m2) {
    run_decode<T, at::Float8_e5m2>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
  } else if (cache_type == at::kChar) {
    run_decode<T, int8_t>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
  } else if constexpr (std::is_same_v<T, float>) {
    if (cache_type == at::kBFloat16) {
      run_decode_f32_query<at::BFloat16>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
    } else if (cache_type == at::kHalf) {
      run_decode_f32_query<at::Half>(q, k_cache, v_cache, block_tables, seq_lens, out, scale);
    } else {
      TORCH_CHECK(false, kCachePairs);
    }
  } else {
    TORCH_CHECK(false, kCachePairs);
  }
}

}  // namespace

// q [B, Hq, D]; caches [num_blocks, block_size, Hk, D] (q's dtype, bf16/fp16 under a float32
// q, or fp8 e4m3/e5m2 under any), or [num_blocks, block_size, Hk, D + 4] int8 (each row's
// float32 scale after its values); block_tables [B, W] and seq_lens [B] int64. Returns
// [B, Hq, D].
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens,
                                     double scale) {
  check_paged_inputs(q, k_cache, v_cache);
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64,
              "block_tables and seq_lens must be int64");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  seq_lens = seq_lens.contiguous();
  const int64_t num_seqs = q.size(0), num_q_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(block_tables.size(0) == num_seqs && seq_lens.size(0) == num_seqs, "batch mismatch");
  auto out = torch::empty_like(q);
  const float fscale = static_cast<float>(scale);
#ifdef OFFICELLM_AVX512_BF16
  if (q.scalar_type() == at::kBFloat16 && cache_type == at::kBFloat16) {
    if (Bf16Kernel kernel = pick_bf16_kernel(head_dim, num_q_heads / num_kv_heads)) {
      kernel(q.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(),
             v_cache.data_ptr<at::BFloat16>(), block_tables.data_ptr<int64_t>(),
             seq_lens.data_ptr<int64_t>(), out.data_ptr<at::BFloat16>(), num_seqs, num_q_heads,
             num_kv_heads, block_size, block_tables.size(1), fscale);
      return out;
    }
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    dispatch_cache<scalar_t>(cache_type, q, k_cache, v_cache, block_tables, seq_lens, out, fscale);
  });
  return out;
}

// q [R, Hq, D]: the last R of a sequence's seq_len tokens (a prompt chunk), whose keys and
// values are all in the caches (laid out as paged_decode_attention's); block_table [W] int64:
// its blocks in order. Row r attends keys [0, seq_len - R + 1 + r). Returns [R, Hq, D].
torch::Tensor paged_chunk_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                    torch::Tensor block_table, int64_t seq_len, double scale) {
  check_paged_inputs(q, k_cache, v_cache);
  TORCH_CHECK(block_table.dim() == 1 && block_table.scalar_type() == torch::kInt64,
              "block_table must be one int64 row");
  const int64_t rows = q.size(0), block_size = k_cache.size(1);
  TORCH_CHECK(rows >= 1 && rows <= seq_len, "a chunk has 1 to seq_len rows");
  TORCH_CHECK(block_table.size(0) * block_size >= seq_len, "block_table is too short for seq_len");
#ifdef OFFICELLM_CHUNK_KERNEL
  const auto q_type = q.scalar_type();
  if ((q.size(2) == 64 || q.size(2) == 128) &&
      (q_type == at::kFloat || q_type == at::kBFloat16 || q_type == at::kHalf)) {
    q = q.contiguous();
    block_table = block_table.contiguous();
    auto out = torch::empty_like(q);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q_type, "paged_chunk_attention", [&] {
      run_chunk<scalar_t>(q, k_cache, v_cache, block_table, seq_len, out,
                          static_cast<float>(scale));
    });
    return out;
  }
#endif
  // Row by row through the decode kernel, each row a sequence of its own causal length.
  auto tables = block_table.unsqueeze(0).expand({rows, -1}).contiguous();
  auto lens = torch::arange(seq_len - rows + 1, seq_len + 1, block_table.options());
  return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale);
}

// What the paged attention kernels share (decode_attention.cpp, chunk_attention.cpp): the
// cache's element types and their row loads, the walk over a sequence's blocks with its
// prefetches, the split of a context into parts, one block's online softmax and the checks
// of the inputs.
//
// Everything below is in an anonymous namespace on purpose: each kernel file that includes
// this compiles its own copy under its own flags (kernels/build/cpu_kernels.py), so no
// inline definition is shared between files built differently, which the linker would
// otherwise resolve to one of them.

#pragma once

#include "entry_points.h"

#include <ATen/Parallel.h>

#if defined(__AVX2__) || defined(__F16C__) || (defined(__AVX512F__) && defined(__AVX512BF16__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define OFFICELLM_AVX512_BF16 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define OFFICELLM_AVX2_F32Q 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>


// The query types the attention kernels take: float32, bf16 and fp16 (the engine's dtypes).
// Not float64, which AT_DISPATCH_FLOATING_TYPES would add: every query type multiplies the
// kernels instantiated (cache types x head sizes), and so the build's time, for a type the
// engine never runs.
#define OFFICELLM_DISPATCH_QUERY_TYPES(TYPE, NAME, ...)        \
  AT_DISPATCH_SWITCH(TYPE, NAME,                               \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

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

// A float buffer on a 64-byte boundary. The kernels' auto-vectorized reductions (the dot
// products and softmax sums under `omp simd reduction`) may peel a few leading elements to
// reach an aligned address, and the peel count, so the order of the sum, would then follow
// wherever malloc placed the buffer: a row's scores changed with the heap's state, which the
// batch around it decides (--batch-invariant found it).
class AlignedFloats {
 public:
  explicit AlignedFloats(int64_t n)
      : data_(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64))) {
    TORCH_CHECK(data_ != nullptr, "out of memory");
  }
  ~AlignedFloats() { std::free(data_); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() { return data_; }
  float& operator[](int64_t i) { return data_[i]; }

 private:
  float* data_;
};

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
// of n tokens whose visible keys start at position from (a sliding window's; 0 otherwise),
// in order; a block's pointer is its first visible token's first KV head, and its rows for
// every KV head follow one another (one contiguous run of tokens x token_elems). The block
// holding position from is passed from that token on, as a shorter block: the keys before
// it are never read, nor is any block before it (those may be the null block). The body
// calls the prefetcher's step() steps_per_token times per token of its block, which fetches
// the next block in time.
template <typename C, typename Body>
inline void walk_blocks(const C* k_cache, const C* v_cache, const int64_t* table, int64_t first,
                        int64_t end, int64_t n, int64_t from, int64_t block_size,
                        int64_t token_elems, int64_t steps_per_token, Body&& body) {
  const int64_t block_elems = block_size * token_elems;
  auto tokens = [&](int64_t blk) { return std::min(block_size, n - blk * block_size); };
  for (int64_t blk = first; blk < end; ++blk) {
    const int64_t next = blk + 1 < end ? table[blk + 1] * block_elems : 0;
    const int64_t next_bytes =
        blk + 1 < end ? tokens(blk + 1) * token_elems * static_cast<int64_t>(sizeof(C)) : 0;
    // Tokens of this block before the window (only ever in the window's first block).
    const int64_t hidden = std::max<int64_t>(0, from - blk * block_size);
    const int64_t skip = table[blk] * block_elems + hidden * token_elems;
    Prefetcher prefetcher(k_cache + next, v_cache + next, next_bytes,
                          (tokens(blk) - hidden) * steps_per_token);
    body(k_cache + skip, v_cache + skip, tokens(blk) - hidden, prefetcher);
    prefetcher.finish();
  }
}

// The context of one sequence is cut into parts, so that one long sequence (the desk case:
// one user) still gives every thread work; each part is attended on its own and the parts
// are merged by their softmax maxima and sums at the end. Items are taken longest first from
// a shared counter, so threads that drew short contexts take more of them instead of waiting
// at the barrier for the one that drew the longest.
//
// Only the blocks that hold visible keys are cut: from the one holding the sequence's first
// visible key (a sliding window's first; block 0 without one) to its last, so a sliding
// layer over a long chat costs its window's work whatever the chat's length.
//
// How a context is cut (Split):
// - kFixed (decodes): parts of kMinPartBlocks blocks from the first visible block, the last
//   one shorter. A row's arithmetic then depends on its own context (its length and
//   window) alone, never on the batch beside it, which is what lets --batch-invariant run
//   every row of every step here (engine/attention/row_attention.py); decode attention
//   measured within 2 % of the adaptive split (docs/performance.md).
// - kAdaptive (prompt chunks): parts of min_part_blocks or more, sized so the whole batch
//   makes about four items per thread.
constexpr int64_t kMinPartBlocks = 8;

enum class Split { kFixed, kAdaptive };

// The per-item state: one accumulator row, running max and sum per query head.
struct PartState {
  float* acc;      // [num_q_heads, d], not yet divided by the sum
  float* run_max;  // [num_q_heads]
  float* run_sum;  // [num_q_heads]
};

// attend(b, first_block, end_block, state) runs the online softmax over those blocks of
// sequence b (of seq_lens[b] tokens, the first visible at position starts[b]) for every query
// head, starting from the state as given (zero acc and sum, max -1e30); store(b, q_head,
// acc_row, inv_sum) writes one output row. sink_of(b, q_head) is that row's sink logit
// (gpt-oss: one more score of the softmax, with no value), or nullptr for none; it joins
// the row's max and sum once, where its parts are merged.
template <typename Attend, typename SinkOf, typename Store>
void over_context_parts(int64_t num_seqs, const int64_t* seq_lens, const int64_t* starts,
                        int64_t block_size, int64_t num_q_heads, int64_t d,
                        int64_t min_part_blocks, Split split, Attend&& attend, SinkOf&& sink_of,
                        Store&& store) {
  const int64_t threads = at::get_num_threads();
  // Sequence b's visible blocks: [first_block[b], first_block[b] + blocks[b]).
  std::vector<int64_t> blocks(num_seqs), first_block(num_seqs), parts(num_seqs),
      first_part(num_seqs + 1, 0);
  int64_t total_blocks = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    first_block[b] = starts[b] / block_size;
    blocks[b] = (seq_lens[b] + block_size - 1) / block_size - first_block[b];
    total_blocks += blocks[b];
  }
  const int64_t part_blocks = split == Split::kFixed
                                  ? min_part_blocks
                                  : std::max(min_part_blocks, total_blocks / (4 * threads));
  for (int64_t b = 0; b < num_seqs; ++b) {
    parts[b] = split == Split::kFixed
                   ? std::max<int64_t>(1, (blocks[b] + part_blocks - 1) / part_blocks)
                   : std::max<int64_t>(1, blocks[b] / part_blocks);
    first_part[b + 1] = first_part[b] + parts[b];
  }
  // Part p of sequence b: blocks [first, end).
  auto bounds = [&](int64_t b, int64_t p) -> std::pair<int64_t, int64_t> {
    const int64_t base = first_block[b];
    if (split == Split::kFixed) {
      return {base + p * part_blocks, base + std::min(blocks[b], (p + 1) * part_blocks)};
    }
    return {base + blocks[b] * p / parts[b], base + blocks[b] * (p + 1) / parts[b]};
  };
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
      const auto [first, end] = bounds(b, p);
      attend(b, first, end, PartState{acc.data() + item * row,
                                      run_max.data() + item * num_q_heads,
                                      run_sum.data() + item * num_q_heads});
      if (pending[b].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      const int64_t p0 = first_part[b];
      for (int64_t hq = 0; hq < num_q_heads; ++hq) {
        const float* sink = sink_of(b, hq);
        float top = sink ? *sink : -1e30f;
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
        if (sink) sum += std::exp(*sink - top);
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

#ifdef OFFICELLM_AVX2_F32Q
// The sums of 4 vectors' lanes, one float each.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
#endif

// The checks both entry points make of q [rows, Hq, D] and the paged caches.
void check_paged_inputs(const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache) {
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
  OFFICELLM_DISPATCH_QUERY_TYPES(q.scalar_type(), "paged_attention", [&] {
    with_cache_type(cache_type, [&](auto cache_tag) {
      readable = readable_pair<scalar_t, decltype(cache_tag)>();
    });
  });
  TORCH_CHECK(readable, kCachePairs);
}

// The first key a query at position pos sees under a sliding window of `window` keys (keys
// pos - window < j <= pos, transformers' rule); 0 without one (window 0).
inline int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// The sink logits as a float32 [num_q_heads] tensor, or an undefined tensor for none.
at::Tensor checked_sinks(const c10::optional<at::Tensor>& sinks, int64_t num_q_heads) {
  if (!sinks.has_value() || !sinks->defined()) return {};
  TORCH_CHECK(sinks->device().is_cpu() && sinks->dim() == 1 && sinks->size(0) == num_q_heads,
              "sinks must be one CPU logit per query head");
  return sinks->to(at::kFloat).contiguous();
}

}  // namespace

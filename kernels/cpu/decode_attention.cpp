// Paged attention for the CPU, keys and values read straight from the paged cache through the
// block table, one query token per sequence (a decode); a prompt chunk's rows over their
// cached history are chunk_attention.cpp's.
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
// Built on first use by kernels/build/cpu_kernels.py (torch.utils.cpp_extension, one build per ISA
// level chosen at run time).

#include "entry_points.h"
#include "paged_attention.h"

namespace {

// HEAD_DIM > 0 fixes the head size at compile time (fully unrolled, register-resident
// rows); 0 reads it from head_dim.
// T is the query's (and output's) type, C the cache's: a float32 model may keep its KV cache
// in 16 bits, any model in fp8 (--kv-cache-dtype), converted to float on load (F16C, a
// shift for bf16, the byte laid into a half for fp8).
template <typename T, typename C, int64_t HEAD_DIM>
void decode_attention(const T* q, const C* k_cache, const C* v_cache, const int64_t* block_tables,
                      const int64_t* seq_lens, const int64_t* starts, const float* sinks, T* out,
                      int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t block_size, int64_t table_width, float scale) {
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t d = HEAD_DIM > 0 ? HEAD_DIM : head_dim;
  const int64_t row_elems = d + row_extra<C>();
  // Stride between consecutive tokens of one KV head inside a block.
  const int64_t token_stride = num_kv_heads * row_elems;
  over_context_parts(num_seqs, seq_lens, starts, block_size, num_q_heads, d, kMinPartBlocks,
                     Split::kFixed,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    AlignedFloats qf(num_q_heads * d), row(d), probs(group * block_size);
    for (int64_t i = 0; i < num_q_heads * d; ++i) qf[i] = to_float(q[b * num_q_heads * d + i]) * scale;
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                starts[b], block_size, token_stride, 2 * num_kv_heads,
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
  }, [&](int64_t, int64_t hq) { return sinks ? sinks + hq : nullptr; },
  [&](int64_t b, int64_t hq, const float* acc, float inv) {
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
                                  const int64_t* seq_lens, const int64_t* starts,
                                  const float* sinks, at::BFloat16* out, int64_t num_seqs,
                                  int64_t num_q_heads, int64_t num_kv_heads, int64_t block_size,
                                  int64_t table_width, float scale) {
  constexpr int64_t kPairs = D / 32;  // 512-bit vectors of bf16 per row
  constexpr int64_t kVecs = D / 16;   // 512-bit vectors of fp32 per row
  const int64_t token_stride = num_kv_heads * D;
  over_context_parts(num_seqs, seq_lens, starts, block_size, num_q_heads, D, kMinPartBlocks,
                     Split::kFixed,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    AlignedFloats probs(G * block_size);
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                starts[b], block_size, token_stride, 2 * num_kv_heads,
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
  }, [&](int64_t, int64_t hq) { return sinks ? sinks + hq : nullptr; },
  [&](int64_t b, int64_t hq, const float* acc, float inv) {
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
                            const int64_t*, const int64_t*, const int64_t*, const float*,
                            at::BFloat16*, int64_t, int64_t, int64_t, int64_t, int64_t, float);

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

#ifdef OFFICELLM_AVX2_F32Q
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
                           const int64_t* block_tables, const int64_t* seq_lens,
                           const int64_t* starts, const float* sinks, float* out,
                           int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t block_size, int64_t table_width, float scale) {
  constexpr int64_t kVecs = D / 8;
  // p.v in chunks of kChunk vectors, G x kChunk accumulators held in registers (16 on AVX2).
  constexpr int64_t kChunk = chunk_vectors(kVecs, G);
  constexpr int64_t kGroups4 = (G + 3) / 4;
  const int64_t token_stride = num_kv_heads * D;
  over_context_parts(num_seqs, seq_lens, starts, block_size, num_q_heads, D, kMinPartBlocks,
                     Split::kFixed,
                     [&](int64_t b, int64_t first, int64_t end, PartState st) {
    AlignedFloats qf(num_q_heads * D), probs(G * block_size);
    for (int64_t i = 0; i < num_q_heads * D; ++i) qf[i] = q[b * num_q_heads * D + i] * scale;
    walk_blocks(k_cache, v_cache, block_tables + b * table_width, first, end, seq_lens[b],
                starts[b], block_size, token_stride, 2 * num_kv_heads,
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
  }, [&](int64_t, int64_t hq) { return sinks ? sinks + hq : nullptr; },
  [&](int64_t b, int64_t hq, const float* acc, float inv) {
    float* dst = out + (b * num_q_heads + hq) * D;
    const __m256 scale_by = _mm256_set1_ps(inv);
    for (int64_t v = 0; v < kVecs; ++v) {
      _mm256_storeu_ps(dst + v * 8, _mm256_mul_ps(_mm256_loadu_ps(acc + v * 8), scale_by));
    }
  });
}

template <typename C>
using Avx2Kernel = void (*)(const float*, const C*, const C*, const int64_t*, const int64_t*,
                            const int64_t*, const float*, float*, int64_t, int64_t, int64_t,
                            int64_t, int64_t, float);

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

// One call's inputs: the tensors, each sequence's first visible key and the sink logits.
struct DecodeCall {
  const at::Tensor& q;
  const at::Tensor& k_cache;
  const at::Tensor& v_cache;
  const at::Tensor& block_tables;
  const at::Tensor& seq_lens;
  at::Tensor& out;
  const int64_t* starts;  // [B]
  const float* sinks;     // [Hq], or nullptr
  float scale;
};

// The kernel for a query type T and a cache type C, by head size.
template <typename T, typename C>
void run_decode(const DecodeCall& c) {
  const int64_t num_seqs = c.q.size(0), num_q_heads = c.q.size(1), head_dim = c.q.size(2);
  auto run = [&](auto kernel) {
    kernel(c.q.data_ptr<T>(), c.k_cache.data_ptr<C>(), c.v_cache.data_ptr<C>(),
           c.block_tables.data_ptr<int64_t>(), c.seq_lens.data_ptr<int64_t>(), c.starts,
           c.sinks, c.out.data_ptr<T>(), num_seqs, num_q_heads, c.k_cache.size(2), head_dim,
           c.k_cache.size(1), c.block_tables.size(1), c.scale);
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
void run_decode_f32_query(const DecodeCall& c) {
#ifdef OFFICELLM_AVX2_F32Q
  const int64_t num_q_heads = c.q.size(1), num_kv_heads = c.k_cache.size(2);
  if (Avx2Kernel<C> kernel = pick_avx2_kernel<C>(c.q.size(2), num_q_heads / num_kv_heads)) {
    kernel(c.q.data_ptr<float>(), c.k_cache.data_ptr<C>(), c.v_cache.data_ptr<C>(),
           c.block_tables.data_ptr<int64_t>(), c.seq_lens.data_ptr<int64_t>(), c.starts,
           c.sinks, c.out.data_ptr<float>(), c.q.size(0), num_q_heads, num_kv_heads,
           c.k_cache.size(1), c.block_tables.size(1), c.scale);
    return;
  }
#endif
  run_decode<float, C>(c);
}

template <typename T>
void dispatch_cache(at::ScalarType cache_type, const DecodeCall& c) {
  if (cache_type == c.q.scalar_type()) {
    run_decode<T, T>(c);
  } else if (cache_type == at::kFloat8_e4m3fn) {
    run_decode<T, at::Float8_e4m3fn>(c);
  } else if (cache_type == at::kFloat8_e5m2) {
    run_decode<T, at::Float8_e5m2>(c);
  } else if (cache_type == at::kChar) {
    run_decode<T, int8_t>(c);
  } else if constexpr (std::is_same_v<T, float>) {
    if (cache_type == at::kBFloat16) {
      run_decode_f32_query<at::BFloat16>(c);
    } else if (cache_type == at::kHalf) {
      run_decode_f32_query<at::Half>(c);
    } else {
      TORCH_CHECK(false, kCachePairs);
    }
  } else {
    TORCH_CHECK(false, kCachePairs);
  }
}

}  // namespace

// See entry_points.h.
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                     at::Tensor block_tables, at::Tensor seq_lens,
                                     double scale, int64_t window,
                                     c10::optional<at::Tensor> sinks) {
  check_paged_inputs(q, k_cache, v_cache);
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "block_tables and seq_lens must be int64");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  seq_lens = seq_lens.contiguous();
  const int64_t num_seqs = q.size(0), num_q_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(block_tables.size(0) == num_seqs && seq_lens.size(0) == num_seqs, "batch mismatch");
  TORCH_CHECK(window >= 0, "window must be 0 (none) or a number of keys");
  const at::Tensor sink_logits = checked_sinks(sinks, num_q_heads);
  const float* sink_ptr = sink_logits.defined() ? sink_logits.data_ptr<float>() : nullptr;
  // Each sequence's query is its last token: its first visible key.
  std::vector<int64_t> starts(num_seqs);
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < num_seqs; ++b) starts[b] = window_start(lens[b] - 1, window);
  auto out = at::empty_like(q);
  const float fscale = static_cast<float>(scale);
#ifdef OFFICELLM_AVX512_BF16
  if (q.scalar_type() == at::kBFloat16 && cache_type == at::kBFloat16) {
    if (Bf16Kernel kernel = pick_bf16_kernel(head_dim, num_q_heads / num_kv_heads)) {
      kernel(q.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(),
             v_cache.data_ptr<at::BFloat16>(), block_tables.data_ptr<int64_t>(), lens,
             starts.data(), sink_ptr, out.data_ptr<at::BFloat16>(), num_seqs, num_q_heads,
             num_kv_heads, block_size, block_tables.size(1), fscale);
      return out;
    }
  }
#endif
  const DecodeCall call{q, k_cache, v_cache, block_tables, seq_lens, out, starts.data(), sink_ptr,
                        fscale};
  OFFICELLM_DISPATCH_QUERY_TYPES(q.scalar_type(), "paged_decode_attention", [&] {
    dispatch_cache<scalar_t>(cache_type, call);
  });
  return out;
}

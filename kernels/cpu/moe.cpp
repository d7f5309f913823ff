// A mixture-of-experts layer's experts (kernels/reference/moe.py's moe_experts): for each
// token, the sum over the k experts its router picked of weight x expert(x), an expert being
// w2 act(w13 x + b13) + b2, its weights dense (float32/bf16) or GGUF blocks.
//
// Why one kernel: a decode token reads only its k experts (Qwen3-30B-A3B: 8 of 128, a
// sixteenth of the layer's bytes), so the call is bound by streaming those experts' bytes
// once. The tokens are grouped by expert (a count, a prefix sum, a scatter: one pass), so
// each active expert's weights are read once per call whatever the number of its tokens, and
// the work is shared out as (expert, tile of output rows) items, pulled by the threads as
// they finish (experts get uneven numbers of tokens), so that one token's eight experts keep
// every core streaming. Three steps, each waiting for the one before: the gate/up
// projection of every (token, expert) pair, the activation of each pair's row (quantized per
// 32 values for a down projection in blocks), the down projection; then each token's sum.
//
// Blocks: x is quantized per 32-value block once per token (quant_matmul's quantize_rows),
// and the pairs of one expert read copies of their tokens' rows; each expert's rows then go
// through quant_matmul's own tiles (quant_matmul_avx2.h / _portable.h, GGUF rows or
// quant_pack's layout). Dense: a float32 tile of 4 weight rows x up to 4 tokens with fused
// multiply-adds, bf16 weights widened as they are loaded.
//
// Numerics, the contract with kernels/reference/moe.py (tests/kernels/test_cpu_moe.py):
// - Blocks: each projection's float operations are quant_matmul's (its header), so a pair's
//   projection equals quant_reference.quant_matmul of the same row bit for bit, and a bias
//   is one float add after it, as the reference adds it. The activation is float32 (std::exp,
//   std::tanh in the reference's formula) where torch uses its own vectorized exp: they
//   differ in the last bit now and then, which the down projection's int8 rounding of the
//   activation can turn into one quantization step of one value. So the result equals the
//   reference's up to that, not bit for bit.
// - Dense: float32 fused multiply-adds in the tile's order (the reference's BLAS has its
//   own): within float32 rounding of the reference.
// - Each token's sum: acc = 0, then acc = acc + weight * (projection + b2) for its experts
//   in ascending id order (a repeated id: in slot order), the reference's index_add order;
//   no atomics, so the result does not depend on the number of threads.
// - bf16 x: everything above in float32, rounded to bf16 once at the end (the reference
//   rounds after each of its ops): equal within bf16 rounding.
// Compiled without -ffast-math (kernels/build/cpu_kernels.py), as quant_matmul.cpp is.

#include "entry_points.h"
#include "quant_matmul_formats.h"

#if defined(OFFICELLM_QMM_AVX2)
#include "quant_matmul_avx2.h"
#else
#include "quant_matmul_portable.h"
#endif

#include <atomic>

namespace {

constexpr int64_t DENSE = -1;  // the format argument of dense weights
// Tokens per pass: bounds the pairs' buffers (a pass of 512 tokens, top-8, hidden 2048:
// 32 MB of projections) at the cost of reading the experts once per 512 tokens.
constexpr int64_t TOKENS_PER_PASS = 512;
// Output rows per work item: a multiple of 8 (a tile's weight rows; a packed group).
constexpr int64_t ITEM_ROWS = 128;

enum class Activation { silu, gelu_tanh, clamped_swiglu };

struct ActivationSpec {
  Activation kind;
  float alpha, limit;
};

// fn(i) for i in [0, count), the items pulled one at a time by every thread (items cost
// unevenly: an expert's tokens). Each item's result depends on the item alone.
template <typename Fn>
void run_items(int64_t count, Fn&& fn) {
  if (count == 0) return;
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < count; i = next++) fn(i);
  });
}

// One expert matrix stack [E, N, K]: dense (float32 / bf16), GGUF rows or quant_pack's
// layout ([E, N / 8, K / unit weights, unit bytes]).
struct ExpertMatrix {
  const at::Tensor& t;
  int64_t format;  // DENSE or a GGUF type
  int64_t N, K;

  bool packed() const { return format != DENSE && t.dim() == 4; }
  int64_t expert_bytes() const { return t.numel() / t.size(0) * t.element_size(); }
};

ExpertMatrix check_matrix(const at::Tensor& t, int64_t format, int64_t E, int64_t K,
                          const char* name) {
  TORCH_CHECK(t.is_contiguous() && t.size(0) == E, name, " must be contiguous [E, ...]");
  if (format == DENSE) {
    TORCH_CHECK(t.dim() == 3 && t.size(2) == K, name, " must be [E, N, ", K, "]");
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
                name, ": dense experts are float32 or bfloat16");
    TORCH_CHECK(K % 8 == 0, name, ": K must be a multiple of 8");
    return {t, format, t.size(1), K};
  }
  const int64_t gw = group_weights(format);
  TORCH_CHECK(gw > 0, "no kernel for GGUF type ", format);
  TORCH_CHECK(t.scalar_type() == at::kByte, name, ": blocks are uint8");
  TORCH_CHECK(K % gw == 0, name, ": K must be a multiple of ", gw, " for GGUF type ", format);
  if (t.dim() == 4) {
#if defined(OFFICELLM_QMM_AVX2)
    const auto [unit_weights, unit_bytes] = packed_unit(format);
    TORCH_CHECK(t.size(2) * unit_weights == K && t.size(3) == unit_bytes, name,
                " is not a packed weight of GGUF type ", format, " with K = ", K);
    return {t, format, t.size(1) * 8, K};
#else
    TORCH_CHECK(false, "this build reads no packed weights (quant_pack returned the rows)");
#endif
  }
  TORCH_CHECK(t.dim() == 3 && t.size(2) == K / gw * group_bytes(format), name, " rows hold ",
              t.size(2), " bytes, expected ", K / gw * group_bytes(format));
  return {t, format, t.size(1), K};
}

// The (token, slot) pairs of a pass grouped by expert: pair p's token and slot, sorted by
// (expert, token, slot); expert e's pairs at [offset[e], offset[e + 1]).
struct Routing {
  std::vector<int64_t> offset;  // [E + 1]
  std::vector<int32_t> token, slot, expert;
  std::vector<int32_t> active;  // the experts with pairs, ascending

  Routing(const int64_t* ids, int64_t T, int64_t k, int64_t E)
      : offset(E + 1, 0), token(T * k), slot(T * k), expert(T * k) {
    for (int64_t i = 0; i < T * k; ++i) {
      TORCH_CHECK(ids[i] >= 0 && ids[i] < E, "expert id ", ids[i], " not in [0, ", E, ")");
      ++offset[ids[i] + 1];
    }
    for (int64_t e = 0; e < E; ++e) {
      if (offset[e + 1] > 0) active.push_back(static_cast<int32_t>(e));
      offset[e + 1] += offset[e];
    }
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) {
      const int64_t p = cursor[ids[i]]++;
      token[p] = static_cast<int32_t>(i / k);
      slot[p] = static_cast<int32_t>(i % k);
      expert[p] = static_cast<int32_t>(ids[i]);
    }
  }

  int64_t pairs() const { return static_cast<int64_t>(token.size()); }
  int64_t count(int64_t e) const { return offset[e + 1] - offset[e]; }
};

// The pairs' input rows to one projection, in pair order: quantized per block (each expert's
// share block-major on its own, as quant_matmul's tiles read it) or float32.
struct PairRows {
  int64_t K = 0, nb = 0;
  std::vector<float> dense;  // [P, K]
  std::vector<int8_t> q;     // [P, K]
  std::vector<float> d, sum;  // expert e's block b, pair m at offset[e] * nb + b * M_e + m
  std::vector<int32_t> isum;  // at 2 * offset[e] * nb + (2b + h) * M_e + m

  PairRows(int64_t P, int64_t K, bool blocks) : K(K), nb(K / QK) {
    if (blocks) {
      q.resize(P * K);
      d.resize(P * nb);
      sum.resize(P * nb);
      isum.resize(2 * P * nb);
    } else {
      dense.resize(P * K);
    }
  }

  // Block b of pair p (expert e's m-th of M_e) from its quantized values.
  void set_block(const Routing& r, int64_t p, int64_t b, const QuantizedBlock& blk) {
    const int64_t e = r.expert[p], base = r.offset[e], M = r.count(e), m = p - base;
    d[base * nb + b * M + m] = blk.d;
    sum[base * nb + b * M + m] = blk.sum;
    isum[2 * base * nb + 2 * b * M + m] = blk.halves[0];
    isum[2 * base * nb + (2 * b + 1) * M + m] = blk.halves[1];
  }

  XBlocks expert_view(const Routing& r, int64_t e) const {
    const int64_t base = r.offset[e];
    return {q.data() + base * K, d.data() + base * nb, sum.data() + base * nb,
            isum.data() + 2 * base * nb};
  }
};

// ---- dense tiles -------------------------------------------------------------------------

#if defined(OFFICELLM_QMM_AVX2)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // bf16 is float32's top half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// y[m, n] for NR weight rows from n and MR x rows from m: eight-wide partial sums along K.
template <typename W, int NR, int MR>
void dense_tile(const W* w, const float* x, float* y, int64_t K, int64_t N, int64_t n,
                int64_t m) {
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int r = 0; r < MR; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm256_loadu_ps(x + (m + r) * K + k);
    for (int i = 0; i < NR; ++i) {
      const __m256 wv = load8(w + (n + i) * K + k);
      for (int r = 0; r < MR; ++r) acc[i][r] = _mm256_fmadd_ps(wv, xv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int r = 0; r < MR; ++r) y[(m + r) * N + n + i] = sum8(acc[i][r]);
}
#else
template <typename W, int NR, int MR>
void dense_tile(const W* w, const float* x, float* y, int64_t K, int64_t N, int64_t n,
                int64_t m) {
  for (int i = 0; i < NR; ++i)
    for (int r = 0; r < MR; ++r) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<float>(w[(n + i) * K + k]) * x[(m + r) * K + k];
      y[(m + r) * N + n + i] = acc;
    }
}
#endif

// Rows [n0, n1) of y [M, N] = x [M, K] w^T, w dense [N, K].
template <typename W>
void dense_rows(const W* w, const float* x, float* y, int64_t M, int64_t N, int64_t K,
                int64_t n0, int64_t n1) {
  constexpr int NR = 4, MR = 4;
  for (int64_t m = 0; m < M; m += MR) {
    const int64_t rows = std::min<int64_t>(MR, M - m);
    int64_t n = n0;
    auto tiles = [&](auto mr) {
      constexpr int R = decltype(mr)::value;
      for (; n + NR <= n1; n += NR) dense_tile<W, NR, R>(w, x, y, K, N, n, m);
      for (; n < n1; ++n) dense_tile<W, 1, R>(w, x, y, K, N, n, m);
    };
    switch (rows) {
      case 4: tiles(std::integral_constant<int, 4>{}); break;
      case 3: tiles(std::integral_constant<int, 3>{}); break;
      case 2: tiles(std::integral_constant<int, 2>{}); break;
      default: tiles(std::integral_constant<int, 1>{}); break;
    }
  }
}

// ---- one projection over every active expert ---------------------------------------------

// y [P, N] (pair order) = each pair's row of `in` times its expert's matrix, as
// (expert, ITEM_ROWS output rows) items.
void project(const ExpertMatrix& w, const Routing& r, const PairRows& in, float* y) {
  struct Item {
    int32_t e;
    int64_t n0, n1;
  };
  std::vector<Item> items;
  for (int32_t e : r.active)
    for (int64_t n0 = 0; n0 < w.N; n0 += ITEM_ROWS)
      items.push_back({e, n0, std::min(w.N, n0 + ITEM_ROWS)});
  const uint8_t* base = static_cast<const uint8_t*>(w.t.data_ptr());
  const int64_t stride = w.expert_bytes();
  run_items(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& it = items[i];
    const int64_t M = r.count(it.e), first = r.offset[it.e];
    const uint8_t* we = base + it.e * stride;
    float* ye = y + first * w.N;
    if (w.format == DENSE) {
      const float* xe = in.dense.data() + first * w.K;
      if (w.t.scalar_type() == at::kBFloat16) {
        dense_rows(reinterpret_cast<const at::BFloat16*>(we), xe, ye, M, w.N, w.K, it.n0,
                   it.n1);
      } else {
        dense_rows(reinterpret_cast<const float*>(we), xe, ye, M, w.N, w.K, it.n0, it.n1);
      }
      return;
    }
    const XBlocks xq = in.expert_view(r, it.e);
    with_format(w.format, [&](auto f) {
      constexpr int64_t F = decltype(f)::value;
#if defined(OFFICELLM_QMM_AVX2)
      if (w.packed()) {
        packed_rows<F>(we, xq, ye, M, w.N, in.nb, it.n0 / 8, it.n1 / 8);
        return;
      }
#endif
      const int64_t row_bytes = w.K / group_weights(F) * group_bytes(F);
      matmul_rows<F>(we, row_bytes, xq, ye, M, w.N, in.nb, it.n0, it.n1);
    });
  });
}

// ---- the activation ----------------------------------------------------------------------

inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// out [I] = act(h [2I]: gate, then up), the reference's formulas in float32.
void activate(const float* h, float* out, int64_t I, const ActivationSpec& a) {
  const float* gate = h;
  const float* up = h + I;
  for (int64_t j = 0; j < I; ++j) {
    const float g = gate[j];
    switch (a.kind) {
      case Activation::silu: out[j] = g / (1.f + std::exp(-g)) * up[j]; break;
      case Activation::gelu_tanh: {
        const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[j] = 0.5f * g * (1.f + std::tanh(inner)) * up[j];
        break;
      }
      case Activation::clamped_swiglu: {
        const float gc = std::min(g, a.limit);
        const float u = std::min(std::max(up[j], -a.limit), a.limit);
        out[j] = (u + 1.f) * (gc * sigmoid(gc * a.alpha));
        break;
      }
    }
  }
}

// The down projection's input rows: each pair's h + b13, activated, then quantized per
// block (blocks) or kept as float32 (dense).
void activate_pairs(const Routing& r, float* h, const float* b13, int64_t I,
                    const ActivationSpec& a, PairRows& out) {
  const bool blocks = out.dense.empty();
  at::parallel_for(0, r.pairs(), std::max<int64_t>(1, 4096 / I), [&](int64_t p0, int64_t p1) {
    std::vector<float> row(blocks ? I : 0);
    for (int64_t p = p0; p < p1; ++p) {
      float* hp = h + p * 2 * I;
      if (b13 != nullptr) {
        const float* b = b13 + static_cast<int64_t>(r.expert[p]) * 2 * I;
        for (int64_t j = 0; j < 2 * I; ++j) hp[j] = hp[j] + b[j];
      }
      float* dst = blocks ? row.data() : out.dense.data() + p * I;
      activate(hp, dst, I, a);
      if (blocks) {
        for (int64_t b = 0; b < out.nb; ++b)
          out.set_block(r, p, b, quantize_block(dst + b * QK, out.q.data() + p * I + b * QK));
      }
    }
  });
}

// The gate/up projection's input rows: the pass's tokens quantized once each, copied to
// their pairs (blocks), or the float rows copied (dense).
void gather_inputs(const Routing& r, const float* x, int64_t T, int64_t H, PairRows& out) {
  const bool blocks = out.dense.empty();
  QuantizedRows xq;
  if (blocks) xq = quantize_rows(at::from_blob(const_cast<float*>(x), {T, H}, at::kFloat));
  at::parallel_for(0, r.pairs(), std::max<int64_t>(1, 16384 / H), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = r.token[p];
      if (!blocks) {
        std::memcpy(out.dense.data() + p * H, x + t * H, H * sizeof(float));
        continue;
      }
      std::memcpy(out.q.data() + p * H, xq.q.data() + t * H, H);
      for (int64_t b = 0; b < out.nb; ++b) {
        const QuantizedBlock blk{xq.d[b * T + t], xq.sum[b * T + t],
                                 {xq.isum[2 * b * T + t], xq.isum[(2 * b + 1) * T + t]}};
        out.set_block(r, p, b, blk);
      }
    }
  });
}

// out [T, H] (float32) = each token's sum over its pairs, ascending expert order.
void combine(const Routing& r, const float* o, const float* b2, const float* weights, int64_t T,
             int64_t k, int64_t H, float* out) {
  // Each token's pairs in pair order (= ascending expert, then slot).
  std::vector<int64_t> token_pairs(T * k), filled(T, 0);
  for (int64_t p = 0; p < r.pairs(); ++p) {
    const int64_t t = r.token[p];
    token_pairs[t * k + filled[t]++] = p;
  }
  at::parallel_for(0, T, std::max<int64_t>(1, 8192 / (H * k)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = out + t * H;
      std::fill(acc, acc + H, 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = token_pairs[t * k + j];
        const float w = weights[t * k + r.slot[p]];
        const float* op = o + p * H;
        const float* b = b2 != nullptr ? b2 + static_cast<int64_t>(r.expert[p]) * H : nullptr;
        for (int64_t c = 0; c < H; ++c) {
          const float v = b != nullptr ? op[c] + b[c] : op[c];
          acc[c] = acc[c] + v * w;
        }
      }
    }
  });
}

ActivationSpec activation_spec(const std::string& kind, double alpha, double limit) {
  Activation a;
  if (kind == "silu") {
    a = Activation::silu;
  } else if (kind == "gelu_tanh") {
    a = Activation::gelu_tanh;
  } else if (kind == "clamped_swiglu") {
    a = Activation::clamped_swiglu;
  } else {
    TORCH_CHECK(false, "unknown expert activation ", kind);
  }
  return {a, static_cast<float>(alpha), static_cast<float>(limit)};
}

const float* bias_data(const std::optional<at::Tensor>& b, int64_t E, int64_t n,
                       const char* name) {
  if (!b.has_value()) return nullptr;
  TORCH_CHECK(b->scalar_type() == at::kFloat && b->is_contiguous() && b->dim() == 2 &&
                  b->size(0) == E && b->size(1) == n,
              name, " must be contiguous float32 [", E, ", ", n, "]");
  return b->data_ptr<float>();
}

}  // namespace

// x [T, H] float32/bf16/fp16; weights float32 [T, k]; ids int64 [T, k]; w13 [E, 2I, H] and
// w2 [E, H, I] dense (float32/bf16; format -1) or GGUF blocks of type fmt13 / fmt2 (rows
// uint8 [E, N, row bytes], or quant_pack's layout per expert [E, N / 8, units, bytes]);
// b13 float32 [E, 2I], b2 [E, H] or None; activation "silu", "gelu_tanh" or
// "clamped_swiglu" (alpha, limit). Returns [T, H] in x's dtype.
at::Tensor moe_experts(at::Tensor x, at::Tensor weights, at::Tensor ids,
                          at::Tensor w13, int64_t fmt13, at::Tensor w2, int64_t fmt2,
                          std::optional<at::Tensor> b13, std::optional<at::Tensor> b2,
                          const std::string& activation, double alpha, double limit) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), "x must be float [T, H]");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == T && ids.scalar_type() == at::kLong,
              "ids must be int64 [T, k]");
  const int64_t k = ids.size(1);
  TORCH_CHECK(weights.scalar_type() == at::kFloat && weights.sizes() == ids.sizes(),
              "weights must be float32 [T, k]");
  const int64_t E = w13.size(0);
  const ExpertMatrix m13 = check_matrix(w13, fmt13, E, H, "w13");
  TORCH_CHECK(m13.N % 2 == 0, "w13 must hold 2I rows");
  const int64_t I = m13.N / 2;
  const ExpertMatrix m2 = check_matrix(w2, fmt2, E, I, "w2");
  TORCH_CHECK(m2.N == H, "w2 must have ", H, " rows");
  TORCH_CHECK(fmt13 == DENSE || H % QK == 0, "H must be a multiple of 32");
  TORCH_CHECK(fmt2 == DENSE || I % QK == 0, "I must be a multiple of 32");
  const float* b13p = bias_data(b13, E, 2 * I, "b13");
  const float* b2p = bias_data(b2, E, H, "b2");
  const ActivationSpec act = activation_spec(activation, alpha, limit);

  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const at::Tensor wf = weights.contiguous();
  const at::Tensor idc = ids.contiguous();
  at::Tensor out = at::empty({T, H}, xf.options());
  for (int64_t t0 = 0; t0 < T; t0 += TOKENS_PER_PASS) {
    const int64_t n = std::min(TOKENS_PER_PASS, T - t0);
    const Routing r(idc.data_ptr<int64_t>() + t0 * k, n, k, E);
    PairRows x_rows(r.pairs(), H, fmt13 != DENSE);
    gather_inputs(r, xf.data_ptr<float>() + t0 * H, n, H, x_rows);
    std::vector<float> h(r.pairs() * 2 * I);
    project(m13, r, x_rows, h.data());
    PairRows a_rows(r.pairs(), I, fmt2 != DENSE);
    activate_pairs(r, h.data(), b13p, I, act, a_rows);
    std::vector<float> o(r.pairs() * H);
    project(m2, r, a_rows, o.data());
    combine(r, o.data(), b2p, wf.data_ptr<float>() + t0 * k, n, k, H,
            out.data_ptr<float>() + t0 * H);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

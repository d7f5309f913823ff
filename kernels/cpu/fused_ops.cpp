// The small per-layer operations of the decoder, fused for the CPU: RMSNorm (with the
// residual add), neox rotary embedding (whole or partial) and the gated MLPs' activations,
// SiLU-and-mul and GELU(tanh)-and-mul.
//
// Why: in a decode step these run on a few rows each, so torch spends its time in dispatch
// and in one OpenMP region per elementwise op (about 35 per layer, ~1,000 per step). One
// pass per operation keeps the numbers identical to kernels/reference/reference.py: every product and
// sum is rounded to the tensor's dtype where torch rounds it; only RMSNorm's mean of squares
// is summed in a different order (float32 either way), one order whatever the batch.

#include "entry_points.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <tuple>

namespace {

// Rows per parallel task: small batches run on the calling thread (no barrier to wait on).
inline int64_t grain_for(int64_t row_elems) { return std::max<int64_t>(1, 65536 / row_elems); }

// Rounds a float to T the way torch does for a T-typed result.
template <typename T>
inline float round_to(float x) { return static_cast<float>(static_cast<T>(x)); }

// One row's work is a function of its own (noinline), so a row is computed by the same code
// whatever the call's row count. Inlined in the row loop, -O3 -ffast-math vectorized the
// `omp simd` sum of squares one way for a lone row and another for rows it had jammed in
// pairs, and a row's norm changed in its last bit with the batch around it
// (--batch-invariant found it). The 16 running lane sums give the sum one written order.
template <typename T>
__attribute__((noinline)) void rms_norm_row(const T* xr, const T* weight, T* o, int64_t hidden,
                                            float eps) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= hidden; i += 16) {
    for (int64_t l = 0; l < 16; ++l) {
      const float v = static_cast<float>(xr[i + l]);
      lanes[l] += v * v;
    }
  }
  for (int64_t l = 0; i + l < hidden; ++l) {
    const float v = static_cast<float>(xr[i + l]);
    lanes[l] += v * v;
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < 16; ++l) sum += lanes[l];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps);
  for (int64_t j = 0; j < hidden; ++j) {
    // weight * (h * inv).to(dtype), as the reference: two roundings to T.
    const float h = round_to<T>(static_cast<float>(xr[j]) * inv);
    o[j] = static_cast<T>(static_cast<float>(weight[j]) * h);
  }
}

// Rows (t, h) of x [T, heads, hidden] at t * x_stride + h * head_stride (heads = 1: a 2-D
// x), into out's contiguous rows.
template <typename T>
void rms_norm_rows(const T* x, int64_t x_stride, int64_t head_stride, int64_t heads,
                   const T* weight, T* out, int64_t rows, int64_t hidden, float eps) {
  at::parallel_for(0, rows, grain_for(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      rms_norm_row(x + r / heads * x_stride + r % heads * head_stride, weight,
                   out + r * hidden, hidden, eps);
    }
  });
}

// silu(gate) * up of one row; a function of its own for the reason rms_norm_row is.
template <typename T>
__attribute__((noinline)) void silu_and_mul_row(const T* g, const T* u, T* o, int64_t inter) {
  for (int64_t i = 0; i < inter; ++i) {
    const float gv = static_cast<float>(g[i]);
    const float act = round_to<T>(gv / (1.0f + std::exp(-gv)));
    o[i] = static_cast<T>(act * static_cast<float>(u[i]));
  }
}

// gelu(gate) * up of one row, gelu with transformers' tanh approximation (gelu_pytorch_tanh)
// written as torch's CPU kernel writes it; a function of its own for the reason
// rms_norm_row is.
template <typename T>
__attribute__((noinline)) void gelu_tanh_and_mul_row(const T* g, const T* u, T* o,
                                                     int64_t inter) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (int64_t i = 0; i < inter; ++i) {
    const float gv = static_cast<float>(g[i]);
    const float inner = kBeta * (gv + kKappa * (gv * gv * gv));
    const float act = round_to<T>(0.5f * gv * (1.0f + std::tanh(inner)));
    o[i] = static_cast<T>(act * static_cast<float>(u[i]));
  }
}

// Runs row(gate, up, out, I) over x [T, 2I] holding gate then up, into a new [T, I].
template <typename Row>
at::Tensor gated_rows(const at::Tensor& x, Row&& row) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [T, 2I] with contiguous rows");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  auto out = at::empty({rows, inter}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gated_rows", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t stride = x.stride(0);
    at::parallel_for(0, rows, grain_for(inter), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* g = xp + r * stride;
        row(g, g + inter, op + r * inter, inter);
      }
    });
  });
  return out;
}

}  // namespace

// x [T, H], or [T, heads, D] (Qwen3's per-head q/k norms, on views of the fused qkv output),
// rows with unit inner stride -> weight * rmsnorm(x) over the last dimension, contiguous.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.stride(-1) == 1,
              "x must be [T, H] or [T, heads, D] with contiguous rows");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == x.scalar_type(), "bad weight");
  const int64_t heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t head_stride = x.dim() == 3 ? x.stride(1) : 0;
  auto out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), head_stride, heads,
                            weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                            x.size(0) * heads, x.size(-1), static_cast<float>(eps));
  });
  return out;
}

// residual <- x + residual (rounded to the dtype); returns (rmsnorm(residual), residual).
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(at::Tensor x, at::Tensor residual,
                                                            at::Tensor weight, double eps) {
  TORCH_CHECK(x.sizes() == residual.sizes() && x.dim() == 2, "x and residual must be [T, H]");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type(), "x and residual dtypes differ");
  x = x.contiguous();
  auto summed = at::empty_like(x);
  auto out = at::empty_like(x);
  residual = residual.contiguous();
  const int64_t rows = x.size(0), hidden = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual.data_ptr<scalar_t>();
    scalar_t* sp = summed.data_ptr<scalar_t>();
    at::parallel_for(0, rows * hidden, std::max<int64_t>(1, 65536), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        sp[i] = static_cast<scalar_t>(static_cast<float>(xp[i]) + static_cast<float>(rp[i]));
      }
    });
    rms_norm_rows<scalar_t>(sp, hidden, 0, 1, weight.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), rows, hidden, static_cast<float>(eps));
  });
  return {out, summed};
}

namespace {

// Each head's first `rotated` values rotate as pairs (i, i + rotated / 2) with cos/sin
// [tokens, rotated]; the rest (partial rotary: Phi-4-mini) are copied as they are.
template <typename T>
void rotary_rows(const T* src, int64_t stride_t, int64_t heads, int64_t head_dim,
                 int64_t rotated, const float* cos, const float* sin, T* dst, int64_t tokens) {
  const int64_t half = rotated / 2;
  at::parallel_for(0, tokens, grain_for(heads * head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos + t * rotated;
      const float* s = sin + t * rotated;
      for (int64_t h = 0; h < heads; ++h) {
        const T* x = src + t * stride_t + h * head_dim;
        T* o = dst + (t * heads + h) * head_dim;
        for (int64_t i = rotated; i < head_dim; ++i) o[i] = x[i];
        // q * cos + rotate_half(q) * sin, with cos/sin cast to the dtype first and every
        // product and the sum rounded, as torch computes it in that dtype.
        for (int64_t i = 0; i < rotated; ++i) {
          const float ci = round_to<T>(c[i]);
          const float si = round_to<T>(s[i]);
          const float rot = i < half ? -static_cast<float>(x[i + half])
                                     : static_cast<float>(x[i - half]);
          const float a = round_to<T>(static_cast<float>(x[i]) * ci);
          const float b = round_to<T>(rot * si);
          o[i] = static_cast<T>(a + b);
        }
      }
    }
  });
}

}  // namespace

// q [T, Hq, D], k [T, Hk, D] (heads and dims contiguous, any token stride); cos/sin [T, R]
// float32, R even and at most D (R < D: partial rotary, the last D - R values of each head
// pass through). Returns rotated copies (contiguous).
std::tuple<at::Tensor, at::Tensor> apply_rotary(at::Tensor q, at::Tensor k,
                                                      at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, "q and k must be [T, H, D]");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && k.stride(2) == 1 &&
                  k.stride(1) == k.size(2),
              "q and k need contiguous heads");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "cos and sin must be float32");
  TORCH_CHECK(q.size(2) == k.size(2), "q and k must share a head size");
  const int64_t rotated = cos.size(-1);
  TORCH_CHECK(cos.dim() == 2 && sin.sizes() == cos.sizes() && cos.size(0) == q.size(0) &&
                  k.size(0) == q.size(0),
              "cos and sin must be [T, R]");
  TORCH_CHECK(rotated % 2 == 0 && rotated <= q.size(2), "the rotated width must be even and at "
              "most the head size");
  cos = cos.contiguous();
  sin = sin.contiguous();
  auto q_out = at::empty(q.sizes(), q.options());
  auto k_out = at::empty(k.sizes(), k.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "apply_rotary", [&] {
    rotary_rows<scalar_t>(q.data_ptr<scalar_t>(), q.stride(0), q.size(1), q.size(2), rotated,
                          cos.data_ptr<float>(), sin.data_ptr<float>(),
                          q_out.data_ptr<scalar_t>(), q.size(0));
    rotary_rows<scalar_t>(k.data_ptr<scalar_t>(), k.stride(0), k.size(1), k.size(2), rotated,
                          cos.data_ptr<float>(), sin.data_ptr<float>(),
                          k_out.data_ptr<scalar_t>(), k.size(0));
  });
  return {q_out, k_out};
}

// x [T, 2I] holding gate then up -> silu(gate) * up, [T, I] (silu rounded, then the product).
at::Tensor silu_and_mul(at::Tensor x) {
  return gated_rows(x, [](auto g, auto u, auto o, int64_t inter) {
    silu_and_mul_row(g, u, o, inter);
  });
}

// x [T, 2I] holding gate then up -> gelu(gate, tanh approximation) * up, [T, I] (gelu
// rounded, then the product): Gemma's GeGLU.
at::Tensor gelu_tanh_and_mul(at::Tensor x) {
  return gated_rows(x, [](auto g, auto u, auto o, int64_t inter) {
    gelu_tanh_and_mul_row(g, u, o, inter);
  });
}

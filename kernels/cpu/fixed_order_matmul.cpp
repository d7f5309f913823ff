// y = x W^T for float32 and bfloat16 weights in one fixed order: every output element is one
// chain of fused multiply-adds over k = 0, 1, ..., K-1, starting from 0
// (fixed_order_matmul). The --batch-invariant mode runs its dense matmuls here.
//
// Why not oneDNN or MKL: their per-row result depends on how many rows the call has (an MKL
// float32 matmul of 1 to 3 rows sums in another order than one of 4 or more), so the same
// request's logits change with whatever else is in its batch, and near-tied greedy tokens
// flip. Here the batch changes only which rows share a weight load, never an element's
// arithmetic, and since a fused multiply-add is exactly specified the chain gives the same
// bits on the AVX-512, AVX2 and portable paths (std::fma): this matmul's results do not
// depend on the CPU either (the attention kernels' do, by build level).
//
// The weight is pre-packed once (fixed_order_pack) into panels of 16 output columns, each
// [K, 16] contiguous, so a step's vector holds 16 columns' weights for one k and the row's x
// value is broadcast against it. Several rows share each weight load (4 rows x 16 columns
// on AVX2, 8 rows x 32 columns on AVX-512: as many independent chains as the registers
// hold, which also hides the FMA's latency). Threads split the panels; each element is
// computed by one thread from start to end. Compiled without -ffast-math
// (kernels/build/cpu_kernels.py): reassociation would split the chains.

#include "entry_points.h"

#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

constexpr int64_t kPanel = 16;  // output columns per panel

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

#if defined(__AVX512F__)
template <typename W>
inline __m512 load16(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// ROWS rows of x against panels pa and pb (pb may be null: its columns are not stored).
template <typename W, int64_t ROWS>
void tile(const float* x, int64_t K, const W* pa, const W* pb, float* y, int64_t ldy,
          int64_t cols_a, int64_t cols_b) {
  __m512 acc[ROWS][2];
  for (int64_t r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const W* pw = pb != nullptr ? pb : pa;  // a lone panel computes its columns twice
  for (int64_t k = 0; k < K; ++k) {
    const __m512 wa = load16(pa + k * kPanel);
    const __m512 wb = load16(pw + k * kPanel);
    for (int64_t r = 0; r < ROWS; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * K + k]);
      acc[r][0] = _mm512_fmadd_ps(xv, wa, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, wb, acc[r][1]);
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, static_cast<__mmask16>((1u << cols_a) - 1), acc[r][0]);
    if (cols_b > 0) {
      _mm512_mask_storeu_ps(y + r * ldy + kPanel, static_cast<__mmask16>((1u << cols_b) - 1),
                            acc[r][1]);
    }
  }
}
constexpr int64_t kRows = 8;  // 16 accumulators of AVX-512's 32 registers
constexpr int64_t kPanelsPerTile = 2;
#elif defined(__AVX2__) && defined(__FMA__)
template <typename W>
inline __m256 load8(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <typename W, int64_t ROWS>
void tile(const float* x, int64_t K, const W* pa, const W*, float* y, int64_t ldy,
          int64_t cols_a, int64_t) {
  __m256 acc[ROWS][2];
  for (int64_t r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = load8(pa + k * kPanel);
    const __m256 w1 = load8(pa + k * kPanel + 8);
    for (int64_t r = 0; r < ROWS; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * K + k);
      acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) {
    float out[kPanel];
    _mm256_storeu_ps(out, acc[r][0]);
    _mm256_storeu_ps(out + 8, acc[r][1]);
    std::memcpy(y + r * ldy, out, cols_a * sizeof(float));
  }
}
constexpr int64_t kRows = 4;  // 8 accumulators of AVX2's 16 registers
constexpr int64_t kPanelsPerTile = 1;
#else
// The panel's 16 weights of row k (W: float, or uint16_t holding bf16's bits) as floats.
template <typename W>
inline void panel_row(const W* p, float* out) {
  if constexpr (std::is_same_v<W, float>) {
    std::memcpy(out, p, kPanel * sizeof(float));
  } else {
    for (int64_t c = 0; c < kPanel; ++c) out[c] = bf16_to_float(p[c]);
  }
}

// Portable: the same chains with std::fma (a library call where the build has no FMA).
template <typename W, int64_t ROWS>
void tile(const float* x, int64_t K, const W* pa, const W*, float* y, int64_t ldy,
          int64_t cols_a, int64_t) {
  float acc[ROWS][kPanel] = {};
  float w[kPanel];
  for (int64_t k = 0; k < K; ++k) {
    panel_row(pa + k * kPanel, w);
    for (int64_t r = 0; r < ROWS; ++r) {
      const float xv = x[r * K + k];
      for (int64_t c = 0; c < kPanel; ++c) acc[r][c] = std::fma(xv, w[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) std::memcpy(y + r * ldy, acc[r], cols_a * sizeof(float));
}
constexpr int64_t kRows = 4;
constexpr int64_t kPanelsPerTile = 1;
#endif

// tile<W, rows> for 1 <= rows <= kRows: the accumulators stay in registers only when the
// row count is a constant.
template <typename W, int64_t ROWS = kRows>
void tile_of(int64_t rows, const float* x, int64_t K, const W* pa, const W* pb, float* y,
             int64_t ldy, int64_t cols_a, int64_t cols_b) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) return tile_of<W, ROWS - 1>(rows, x, K, pa, pb, y, ldy, cols_a, cols_b);
  }
  tile<W, ROWS>(x, K, pa, pb, y, ldy, cols_a, cols_b);
}

template <typename W>
void run(const float* x, const W* panels, float* y, int64_t M, int64_t K, int64_t N) {
  const int64_t num_panels = (N + kPanel - 1) / kPanel;
  const int64_t num_tiles = (num_panels + kPanelsPerTile - 1) / kPanelsPerTile;
  const int64_t panel_elems = K * kPanel;
  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t p = t * kPanelsPerTile;
      const int64_t col = p * kPanel;
      const int64_t cols_a = std::min(kPanel, N - col);
      const bool two = kPanelsPerTile == 2 && p + 1 < num_panels;
      const int64_t cols_b = two ? std::min(kPanel, N - col - kPanel) : 0;
      const W* pa = panels + p * panel_elems;
      const W* pb = two ? panels + (p + 1) * panel_elems : nullptr;
      for (int64_t r0 = 0; r0 < M; r0 += kRows) {
        tile_of<W>(std::min(kRows, M - r0), x + r0 * K, K, pa, pb, y + r0 * N + col, N, cols_a,
                   cols_b);
      }
    }
  });
}

}  // namespace

// weight [N, K] float32 or bfloat16 -> panels [ceil(N / 16), K, 16] of the same dtype, the
// columns past N zero.
at::Tensor fixed_order_pack(at::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2, "weight must be [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "fixed_order_pack takes float32 or bfloat16 weights");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t num_panels = (N + kPanel - 1) / kPanel;
  at::Tensor padded = at::zeros({num_panels * kPanel, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({num_panels, kPanel, K}).transpose(1, 2).contiguous();
}

// x [M, K] in the panels' dtype; panels from fixed_order_pack of an [N, K] weight. Returns
// [M, N] in x's dtype (float32 inside; a bfloat16 result is the float32 chain's rounding).
at::Tensor fixed_order_matmul(at::Tensor x, at::Tensor panels, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && panels.dim() == 3 && panels.size(2) == kPanel,
              "x must be [M, K] and panels [P, K, 16]");
  TORCH_CHECK(x.scalar_type() == panels.scalar_type(), "x and the panels must share a dtype");
  TORCH_CHECK(panels.is_contiguous() && x.size(1) == panels.size(1), "K mismatch");
  TORCH_CHECK(n > (panels.size(0) - 1) * kPanel && n <= panels.size(0) * kPanel,
              "n does not match the panels");
  const int64_t M = x.size(0), K = x.size(1);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({M, n}, xf.options());
  if (M > 0 && n > 0) {
    if (panels.scalar_type() == at::kFloat) {
      run<float>(xf.data_ptr<float>(), panels.data_ptr<float>(), y.data_ptr<float>(), M, K, n);
    } else {
      run<uint16_t>(xf.data_ptr<float>(),
                    reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()),
                    y.data_ptr<float>(), M, K, n);
    }
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

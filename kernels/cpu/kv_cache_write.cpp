// A step's keys and values stored into the paged KV cache on the CPU, one call per layer.
//
// Why: torch's way (kernels/reference/reference.py's write_kv_cache: a check of the slots,
// a cast of each tensor, an index_copy_ into each cache) is about six dispatches, ~95 us a
// layer for one decode token on a 2-core VM: 1.5 ms of a 1B model's ~48 ms token. The values
// stored are the same bits: each converted to the cache's dtype as torch's cast rounds it
// (through float32, to nearest even), a slot of -1 skipped.

#include "entry_points.h"

#include <ATen/Parallel.h>

#include <cstdint>

namespace {

// x [T, H, D] (any strides with unit stride along D) into cache [blocks, block_size, H, D]
// (contiguous) at flat slots.
template <typename S, typename C>
void store(const at::Tensor& x, at::Tensor& cache, const int64_t* slots) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2);
  const int64_t st = x.stride(0), sh = x.stride(1);
  const S* src = x.data_ptr<S>();
  C* dst = cache.data_ptr<C>();
  // A decode step's few rows run on the calling thread; a long prompt's in parallel.
  at::parallel_for(0, T, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        const S* in = src + t * st + h * sh;
        C* out = dst + (slot * H + h) * D;
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<C>(static_cast<float>(in[d]));
      }
    }
  });
}

template <typename S>
void store_into(const at::Tensor& x, at::Tensor& cache, const int64_t* slots) {
  switch (cache.scalar_type()) {
    case at::kFloat: return store<S, float>(x, cache, slots);
    case at::kBFloat16: return store<S, c10::BFloat16>(x, cache, slots);
    case at::kHalf: return store<S, c10::Half>(x, cache, slots);
    default: TORCH_CHECK(false, "write_kv_cache: a float32, bf16 or fp16 cache, not ",
                         cache.scalar_type());
  }
}

void store_any(const at::Tensor& x, at::Tensor& cache, const int64_t* slots) {
  const auto c = cache.scalar_type();
  TORCH_CHECK(c == at::kFloat || c == at::kBFloat16 || c == at::kHalf,
              "write_kv_cache: a float32, bf16 or fp16 cache, not ", c);
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "write_kv_cache: k and v [T, H, D], unit "
              "stride along D");
  TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous() && cache.size(2) == x.size(1) &&
                  cache.size(3) == x.size(2),
              "write_kv_cache: a contiguous cache [blocks, block_size, H, D] for ", x.sizes());
  switch (x.scalar_type()) {
    case at::kFloat: return store_into<float>(x, cache, slots);
    case at::kBFloat16: return store_into<c10::BFloat16>(x, cache, slots);
    case at::kHalf: return store_into<c10::Half>(x, cache, slots);
    default: TORCH_CHECK(false, "write_kv_cache: float32, bf16 or fp16 k and v, not ",
                         x.scalar_type());
  }
}

}  // namespace

void write_kv_cache(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache,
                    at::Tensor slot_mapping) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 &&
                  slot_mapping.size(0) == k.size(0) && slot_mapping.size(0) == v.size(0),
              "write_kv_cache: one int64 slot per token");
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* s = slots.data_ptr<int64_t>();
  store_any(k, k_cache, s);
  store_any(v, v_cache, s);
}

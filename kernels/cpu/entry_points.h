// Every entry point of the CPU kernels: one declaration each, included by the file that
// defines it and by bindings.cpp, which exposes them all as one extension module
// (kernels/build/cpu_kernels.py builds it).

#pragma once

// ATen alone, not <torch/extension.h>: the whole C++ frontend and pybind11 cost each file
// ~20 s more to compile (three builds in a CI run); only bindings.cpp needs them.
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

// The attention entry points take, beside the inputs each describes:
// - window: a sliding-window layer's width (0: full attention). The query at position i sees
//   the keys j with i - window < j <= i. The blocks before a sequence's first visible key
//   are never read, not even prefetched (their table entries may name the null block), and
//   only the visible blocks are cut into parts.
// - sinks: None, or float32 [Hq] (another floating dtype is converted): each query head's
//   sink logit (gpt-oss), one more score of every row's softmax with no value, so the row's
//   weights sum to less than one. In Python both may be left out (bindings.cpp).
//
// decode_attention.cpp: q [B, Hq, D]; caches [num_blocks, block_size, Hk, D] (q's dtype,
// bf16/fp16 under a float32 q, or fp8 e4m3/e5m2 under any), or [num_blocks, block_size, Hk,
// D + 4] int8 (each row's float32 scale after its values); block_tables [B, W] and seq_lens
// [B] int64. Sequence b's query is its last token (position seq_lens[b] - 1). Returns
// [B, Hq, D]; a sequence of length 0 gives zeros.
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                     at::Tensor block_tables, at::Tensor seq_lens,
                                     double scale, int64_t window,
                                     c10::optional<at::Tensor> sinks);
// chunk_attention.cpp: q [R, Hq, D]: the last R of a sequence's seq_len tokens (a prompt
// chunk), whose keys and values are all in the caches (laid out as paged_decode_attention's);
// block_table [W] int64: its blocks in order. Row r is position seq_len - R + r and attends
// keys [0, seq_len - R + 1 + r), the last `window` of them under a window. Returns [R, Hq, D].
at::Tensor paged_chunk_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                    at::Tensor block_table, int64_t seq_len, double scale,
                                    int64_t window, c10::optional<at::Tensor> sinks);
// fused_ops.cpp
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(at::Tensor x, at::Tensor residual,
                                                            at::Tensor weight, double eps);
std::tuple<at::Tensor, at::Tensor> apply_rotary(at::Tensor q, at::Tensor k,
                                                      at::Tensor cos, at::Tensor sin);
at::Tensor silu_and_mul(at::Tensor x);
at::Tensor gelu_tanh_and_mul(at::Tensor x);
// fixed_order_matmul.cpp
at::Tensor fixed_order_pack(at::Tensor weight);
at::Tensor fixed_order_matmul(at::Tensor x, at::Tensor panels, int64_t n);
// quant_matmul.cpp
at::Tensor quant_matmul(at::Tensor x, at::Tensor weight, int64_t format);
at::Tensor quant_pack(at::Tensor weight, int64_t format);
std::string quant_matmul_path();
// moe.cpp
at::Tensor moe_experts(at::Tensor x, at::Tensor weights, at::Tensor ids,
                          at::Tensor w13, int64_t fmt13, at::Tensor w2, int64_t fmt2,
                          std::optional<at::Tensor> b13, std::optional<at::Tensor> b2,
                          const std::string& activation, double alpha, double limit);

// Every entry point of the CPU kernels: one declaration each, included by the file that
// defines it and by bindings.cpp, which exposes them all as one extension module
// (kernels/build/cpu_kernels.py builds it).

#pragma once

#include <torch/extension.h>

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
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens,
                                     double scale, int64_t window,
                                     c10::optional<torch::Tensor> sinks);
// chunk_attention.cpp: q [R, Hq, D]: the last R of a sequence's seq_len tokens (a prompt
// chunk), whose keys and values are all in the caches (laid out as paged_decode_attention's);
// block_table [W] int64: its blocks in order. Row r is position seq_len - R + r and attends
// keys [0, seq_len - R + 1 + r), the last `window` of them under a window. Returns [R, Hq, D].
torch::Tensor paged_chunk_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                    torch::Tensor block_table, int64_t seq_len, double scale,
                                    int64_t window, c10::optional<torch::Tensor> sinks);
// fused_ops.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(torch::Tensor x, torch::Tensor residual,
                                                            torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> apply_rotary(torch::Tensor q, torch::Tensor k,
                                                      torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_and_mul(torch::Tensor x);
torch::Tensor gelu_tanh_and_mul(torch::Tensor x);
// fixed_order_matmul.cpp
torch::Tensor fixed_order_pack(torch::Tensor weight);
torch::Tensor fixed_order_matmul(torch::Tensor x, torch::Tensor panels, int64_t n);
// quant_matmul.cpp
torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor weight, int64_t format);
torch::Tensor quant_pack(torch::Tensor weight, int64_t format);
std::string quant_matmul_path();
// moe.cpp
torch::Tensor moe_experts(torch::Tensor x, torch::Tensor weights, torch::Tensor ids,
                          torch::Tensor w13, int64_t fmt13, torch::Tensor w2, int64_t fmt2,
                          std::optional<torch::Tensor> b13, std::optional<torch::Tensor> b2,
                          const std::string& activation, double alpha, double limit);

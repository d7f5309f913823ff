// Every entry point of the CPU kernels: one declaration each, included by the file that
// defines it and by bindings.cpp, which exposes them all as one extension module
// (kernels/build/cpu_kernels.py builds it).

#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

// decode_attention.cpp
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens,
                                     double scale);
// chunk_attention.cpp
torch::Tensor paged_chunk_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                    torch::Tensor block_table, int64_t seq_len, double scale);
// fused_ops.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(torch::Tensor x, torch::Tensor residual,
                                                            torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> apply_rotary(torch::Tensor q, torch::Tensor k,
                                                      torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_and_mul(torch::Tensor x);
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

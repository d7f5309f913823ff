// Python bindings of the CPU kernels (one extension module: kernels/build/cpu_kernels.py builds it;
// the entry points are declared in entry_points.h).

// pybind11 with torch's tensor casters: not <torch/extension.h>, whose C++ frontend only
// lengthens the build.
#include <torch/csrc/utils/pybind.h>

#include "entry_points.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  // The kernels run without the GIL (they touch no Python object), as torch's own ops do: a
  // server's event loop (detokenizing, streaming) then runs beside a decode step's kernels
  // instead of between them, where the step waited for it.
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  // window and sinks may be left out: full attention, no sinks.
  m.def("paged_decode_attention", &paged_decode_attention,
        "Decode attention over the paged KV cache", py::arg("q"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("window") = 0, py::arg("sinks") = py::none(), no_gil);
  m.def("paged_chunk_attention", &paged_chunk_attention,
        "Causal attention of a prompt chunk over its sequence's paged KV cache", py::arg("q"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("block_table"), py::arg("seq_len"),
        py::arg("scale"), py::arg("window") = 0, py::arg("sinks") = py::none(), no_gil);
  m.def("rms_norm", &rms_norm, "RMSNorm over rows");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "residual add, then RMSNorm");
  m.def("apply_rotary", &apply_rotary, "neox rotary embedding of q and k");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up");
  m.def("gelu_tanh_and_mul", &gelu_tanh_and_mul, "gelu(gate, tanh approximation) * up");
  m.def("fixed_order_pack", &fixed_order_pack,
        "float32/bf16 [N, K] weights in fixed_order_matmul's panels");
  m.def("fixed_order_matmul", &fixed_order_matmul,
        "x W^T, each element one FMA chain over K in order (batch-invariant)", no_gil);
  m.def("quant_matmul", &quant_matmul,
        "x W^T over GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K/MXFP4 weight blocks", no_gil);
  m.def("quant_pack", &quant_pack, "GGUF rows in the layout quant_matmul reads fastest", no_gil);
  m.def("moe_experts", &moe_experts,
        "a mixture-of-experts layer's experts (dense or GGUF blocks), tokens grouped by expert",
        no_gil);
  m.def("quant_matmul_path", &quant_matmul_path, "the instruction set quant_matmul was built for");
}

"""Two fixes for Triton's CPU interpreter (used by the kernel tests and gpu_check's CPU smoke
run; never on a GPU, where compiled kernels take neither path).

The interpreter holds a loaded scalar as a 1-element array and turns it into a Python int
with int(array), which numpy 2 rejects ("only 0-dimensional arrays can be converted"). That
breaks any kernel whose loop bound comes from memory (every paged-attention kernel: the bound
is the sequence length).

The interpreter's own float <-> fp8 conversion rounds without carrying into the exponent
(-31.5 becomes -16, not -32), so an fp8 KV cache written under it would not hold what the GPU
(cvt with round-to-nearest-even) or torch stores; conversions to and from fp8 go through
torch's instead. The same code truncates float32 to bfloat16, which the interpreter holds as
its 16 bits, and tl.dot multiplies those bits as integers: conversions between bfloat16 and
the wider floats go through torch too, and a dot upcasts bfloat16 operands to float32 (exact,
as the tensor cores' products are), so bf16 kernels can be tested on a CPU.
"""

from __future__ import annotations


def patch_scalar_index() -> None:
    """Make the interpreter's tensor.__index__ accept 1-element arrays."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_officellm_patched", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._officellm_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
    _patch_float_conversion(interpreter)
    _patch_bf16_dot(interpreter)


def _patch_float_conversion(interpreter) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import torch

    import triton.language as tl

    # numpy holds bf16 and fp8 as their bits: (numpy storage, torch dtype).
    stored = {tl.float32: (np.float32, torch.float32), tl.float16: (np.float16, torch.float16),
              tl.bfloat16: (np.uint16, torch.bfloat16),
              tl.float8e4nv: (np.uint8, torch.float8_e4m3fn),
              tl.float8e5: (np.uint8, torch.float8_e5m2)}
    narrow = {tl.bfloat16, tl.float8e4nv, tl.float8e5}
    original = interpreter._convert_float

    def convert(data, input_dtype, output_dtype, rounding_mode):  # type: ignore[no-untyped-def]
        if input_dtype not in stored or output_dtype not in stored or \
                not narrow & {input_dtype, output_dtype}:
            return original(data, input_dtype, output_dtype, rounding_mode)
        in_np, in_torch = stored[input_dtype]
        out_np, out_torch = stored[output_dtype]
        x = torch.from_numpy(np.ascontiguousarray(data).view(in_np).copy()).view(in_torch)
        y = x.to(out_torch).view(getattr(torch, np.dtype(out_np).name))
        return y.numpy().reshape(data.shape)

    interpreter._convert_float = convert


def _patch_bf16_dot(interpreter) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    import triton.language as tl

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def as_float32(handle):  # type: ignore[no-untyped-def]
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        return original(self, as_float32(a), as_float32(b), d, input_precision,
                        max_num_imprecise_acc)

    builder.create_dot = create_dot

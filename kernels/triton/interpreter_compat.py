"""Two fixes for Triton's CPU interpreter (used by the kernel tests and gpu_check's CPU smoke
run; never on a GPU, where compiled kernels take neither path).

The interpreter holds a loaded scalar as a 1-element array and turns it into a Python int
with int(array), which numpy 2 rejects ("only 0-dimensional arrays can be converted"). That
breaks any kernel whose loop bound comes from memory (every paged-attention kernel: the bound
is the sequence length).

The interpreter's own float <-> fp8 conversion rounds without carrying into the exponent
(-31.5 becomes -16, not -32), so an fp8 KV cache written under it would not hold what the GPU
(cvt with round-to-nearest-even) or torch stores; conversions to and from fp8 go through
torch's instead.
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
    _patch_fp8_conversion(interpreter)


def _patch_fp8_conversion(interpreter) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import torch

    import triton.language as tl

    fp8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    wide = {tl.float32: (np.float32, torch.float32), tl.float16: (np.float16, torch.float16),
            tl.bfloat16: (np.uint16, torch.bfloat16)}  # numpy holds bf16 as its bits
    original = interpreter._convert_float

    def convert(data, input_dtype, output_dtype, rounding_mode):  # type: ignore[no-untyped-def]
        if input_dtype in wide and output_dtype in fp8:
            np_type, torch_type = wide[input_dtype]
            x = torch.from_numpy(np.ascontiguousarray(data).view(np_type).copy())
            if torch_type == torch.bfloat16:
                x = x.view(torch.int16).view(torch.bfloat16)
            return x.to(fp8[output_dtype]).view(torch.uint8).numpy().reshape(data.shape)
        if input_dtype in fp8 and output_dtype in wide:
            np_type, torch_type = wide[output_dtype]
            x = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).copy())
            y = x.view(fp8[input_dtype]).to(torch_type)
            if torch_type == torch.bfloat16:
                y = y.view(torch.int16)
            return y.numpy().view(np_type).reshape(data.shape)
        return original(data, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert

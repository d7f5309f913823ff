"""A one-line compatibility fix for Triton's CPU interpreter under numpy >= 2 (used by the
kernel tests and gpu_check's CPU smoke run; never on a GPU).

The interpreter holds a loaded scalar as a 1-element array and turns it into a Python int
with int(array), which numpy 2 rejects ("only 0-dimensional arrays can be converted"). That
breaks any kernel whose loop bound comes from memory (every paged-attention kernel: the bound
is the sequence length). Compiled kernels on a GPU never take this path.
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

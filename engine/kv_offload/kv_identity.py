"""What a block's bytes depend on besides its tokens: the model's files, how it was loaded
and on what. A disk tier keeps blocks under this identity, so after an upgrade, another
quantization, KV dtype or block size, or another machine's kernels, no stale block is read
as if it were this model's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

# Bytes hashed at each end of a weight file: enough to tell two files of one size apart
# (a re-quantized or re-converted model) without reading gigabytes at every start.
_SAMPLED_BYTES = 1 << 20


def kv_identity(model_path: Path, loaded_as: Iterable[str]) -> bytes:
    """An identity for the KV a model computes: its files (names, sizes and sampled
    contents) and `loaded_as` (dtype, KV dtype and layout, weight format, kernels, versions)."""
    h = hashlib.blake2b(digest_size=32)
    model_path = Path(model_path)
    files = sorted(p for p in model_path.iterdir() if p.is_file()) if model_path.is_dir() \
        else [model_path]
    for path in files:
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as f:
            h.update(f.read(_SAMPLED_BYTES))
            if size > 2 * _SAMPLED_BYTES:
                f.seek(size - _SAMPLED_BYTES)
                h.update(f.read(_SAMPLED_BYTES))
    for part in loaded_as:
        h.update(part.encode() + b"\0")
    return h.digest()

"""Where a GGUF file keeps its tensors: their names, shapes, types and bytes, read without
decoding the metadata we do not use.

gguf-py's GGUFReader decodes every metadata value into numpy views as it opens a file, one
view per string: the tokenizer's 49,152 tokens and as many merges in the bundled SmolLM2
took 6.6 s, on every start of a server whose `--quantization auto` reads the blocks. This
walks the same layout (GGUF v2 and v3: gguf-py's constants name the types) and skips a
string array by its lengths alone: 0.04 s for the same file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_SCALAR_SIZES = {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor of a GGUF file: `shape` in GGUF's order (the row length first)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GgufLayout:
    """A GGUF file's scalar and string metadata (arrays left out) and its tensors."""

    path: Path
    metadata: dict[str, object]
    tensors: list[GgufTensorInfo]

    def tensor_bytes(self, info: GgufTensorInfo) -> np.ndarray:
        """A copy of `info`'s bytes (uint8), read from the file straight into memory torch
        allocated (one copy, on huge pages where torch's allocator uses them: reading an
        8B model's blocks through a bytes object and a second copy took 12 s of its load)."""
        out = torch.empty(info.nbytes, dtype=torch.uint8).numpy()
        with self.path.open("rb") as f:
            f.seek(info.offset)
            read = f.readinto(memoryview(out))
        if read != info.nbytes:
            raise ValueError(f"{self.path} ends inside tensor {info.name!r}")
        return out


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        text = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, vtype: int) -> object:
        """A scalar or string; an array is skipped (None)."""
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[GGUFValueType(vtype)])[0]
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype != GGUFValueType.ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        item_type, count = self.unpack("<IQ")
        if item_type in _SCALAR_SIZES:
            self.pos += count * _SCALAR_SIZES[GGUFValueType(item_type)]
        elif item_type == GGUFValueType.STRING:
            for _ in range(count):  # lengths only: no string is decoded
                (n,) = struct.unpack_from("<Q", self.buf, self.pos)
                self.pos += 8 + n
        else:
            for _ in range(count):
                self.value(item_type)
        return None


def read_layout(path: Path) -> GgufLayout:
    """The tensors and scalar metadata of the GGUF file at `path` (version 2 or 3)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        magic, version = cur.unpack("<4sI")
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        if version < 2:
            raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        tensor_count, kv_count = cur.unpack("<QQ")
        metadata: dict[str, object] = {}
        for _ in range(kv_count):
            key = cur.string()
            (vtype,) = cur.unpack("<I")
            value = cur.value(vtype)
            if value is not None:
                metadata[key] = value
        infos = []
        for _ in range(tensor_count):
            name = cur.string()
            (n_dims,) = cur.unpack("<I")
            shape = cur.unpack(f"<{n_dims}Q")
            ttype, offset = cur.unpack("<IQ")
            infos.append((name, shape, GGMLQuantizationType(ttype), offset))
        alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
        data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, shape, ttype, offset in infos:
        block_weights, block_bytes = GGML_QUANT_SIZES[ttype]
        count = int(np.prod(shape))
        tensors.append(GgufTensorInfo(name, tuple(int(d) for d in shape), ttype,
                                      data_start + offset, count // block_weights * block_bytes))
    return GgufLayout(path, metadata, tensors)

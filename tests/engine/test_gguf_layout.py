"""engine/loading/gguf_layout.py finds what gguf-py's own reader finds in a GGUF file: every
tensor's name, shape, type and bytes, and the scalar and string metadata, past arrays of
strings and numbers and under a non-default alignment."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from officellm.engine.loading.gguf_layout import read_layout
from officellm.kernels.reference import quant_reference as qr


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("layout") / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("layout test")
    writer.add_custom_alignment(64)
    writer.add_block_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_bool("test.flag", True)
    writer.add_int64("test.big", -(2**40))
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc ü", ""])
    writer.add_array("test.numbers", [1, 2, 3])
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    gen = torch.Generator().manual_seed(0)
    writer.add_tensor("token_embd.weight", qr.QUANTIZERS[qr.Q8_0](
        torch.randn(5, 64, generator=gen)).numpy(), raw_dtype=T.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", torch.randn(7, generator=gen).numpy())
    writer.add_tensor("blk.0.ffn_down.weight", qr.QUANTIZERS[qr.Q4_K](
        torch.randn(3, 256, generator=gen)).numpy(), raw_dtype=T.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_every_tensor_has_gguf_pys_name_shape_type_and_bytes(written):
    layout = read_layout(written)
    theirs = gguf.GGUFReader(str(written)).tensors
    assert [t.name for t in layout.tensors] == [t.name for t in theirs]
    for ours, their in zip(layout.tensors, theirs, strict=True):
        assert ours.shape == tuple(int(d) for d in their.shape)
        assert ours.tensor_type == their.tensor_type
        assert np.array_equal(layout.tensor_bytes(ours),
                              np.asarray(their.data).view(np.uint8).reshape(-1))


def test_scalars_and_strings_are_read_and_arrays_skipped(written):
    metadata = read_layout(written).metadata
    assert metadata["general.architecture"] == "llama"
    assert metadata["general.alignment"] == 64
    assert metadata["llama.block_count"] == 2
    assert metadata["test.flag"] is True and metadata["test.big"] == -(2**40)
    assert metadata["tokenizer.chat_template"] == "{{ messages }}"
    assert "tokenizer.ggml.tokens" not in metadata and "test.numbers" not in metadata


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "not.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_layout(path)

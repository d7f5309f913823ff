"""oneDNN pre-packed bf16 linears: bit-identical to F.linear, so the engine's tokens do not move."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import SamplingParams
from engine.models import packed_linear
from tests.engine.conftest import make_llm

needs_packing = pytest.mark.skipif(
    not packed_linear.can_pack(torch.device("cpu"), torch.bfloat16),
    reason="this torch has no oneDNN packed linear")


@needs_packing
@pytest.mark.parametrize("rows", [0, 1, 7, 16, 300])
def test_packed_linear_is_bit_identical_to_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(384, 96, generator=g).bfloat16()
    b = torch.randn(384, generator=g).bfloat16()
    x = torch.randn(rows, 96, generator=g).bfloat16()
    got = packed_linear.linear(x, w, b, packed_linear.pack(w))
    assert got.shape == (rows, 384)
    assert torch.equal(got, F.linear(x, w, b))


def test_fp32_is_never_packed():
    assert not packed_linear.can_pack(torch.device("cpu"), torch.float32)


@needs_packing
def test_bf16_engine_gives_the_same_tokens_packed_or_not(smollm2_dir, chat_prompt_ids,
                                                         monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    packed_llm = make_llm(smollm2_dir, dtype="bfloat16")
    assert packed_llm.llm_engine.engine_core.model.layers[0].qkv.packed is not None
    packed = [o.outputs[0].token_ids for o in packed_llm.generate(chat_prompt_ids[:4], params)]
    monkeypatch.setattr(packed_linear, "can_pack", lambda device, dtype: False)
    plain_llm = make_llm(smollm2_dir, dtype="bfloat16")
    assert plain_llm.llm_engine.engine_core.model.layers[0].qkv.packed is None
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(chat_prompt_ids[:4], params)]
    assert packed == plain

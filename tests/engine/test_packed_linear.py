"""oneDNN pre-packed bf16 linears: bit-identical to F.linear, so the engine's tokens do not move;
and never attempted on a CPU where oneDNN refuses them (AVX2 only: no AVX-512, no bf16).

The packing tests run only where this CPU can pack, and skip saying why elsewhere. To run
this file as an AVX2-only CPU would on a better one: OFFICELLM_CPU_ISA=avx2 (see
engine/cpu_features.py); the tests of the lower path force that level themselves.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from officellm.engine import SamplingParams
from officellm.engine.models import packed_linear
from officellm.engine.precision.dtype_choice import resolve_dtype
from officellm.kernels.cpu_features import OVERRIDE_ENV, cpu_features
from tests.engine.conftest import make_llm

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
FEATURES = cpu_features()


def _why_no_packing() -> str:
    if not packed_linear.torch_can_pack():
        return "this torch has no oneDNN packed linear"
    return (f"oneDNN cannot pack bf16 weights on this CPU ({FEATURES.describe()}): it needs "
            "AVX-512 BW/VL/DQ or AVX-NE-CONVERT")


needs_packing = pytest.mark.skipif(not packed_linear.can_pack(CPU, torch.bfloat16, FEATURES),
                                   reason=_why_no_packing())


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
    assert not packed_linear.can_pack(CPU, torch.float32)


@needs_packing
def test_bf16_engine_gives_the_same_tokens_packed_or_not(smollm2_dir, chat_prompt_ids,
                                                         monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    packed_llm = make_llm(smollm2_dir, dtype="bfloat16")
    assert packed_llm.llm_engine.engine_core.model.layers[0].qkv.packed is not None
    packed = [o.outputs[0].token_ids for o in packed_llm.generate(chat_prompt_ids[:4], params)]
    monkeypatch.setattr(packed_linear, "can_pack", lambda device, dtype, features=None: False)
    plain_llm = make_llm(smollm2_dir, dtype="bfloat16")
    assert plain_llm.llm_engine.engine_core.model.layers[0].qkv.packed is None
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(chat_prompt_ids[:4], params)]
    assert packed == plain


# -- an AVX2-only CPU, forced on whatever this one is ---------------------------------------

def test_at_the_avx2_level_nothing_packs_and_auto_means_float32(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "avx2")
    features = cpu_features()
    assert not features.can_pack_bf16 and not features.has_bf16_compute
    assert not packed_linear.can_pack(CPU, torch.bfloat16)
    assert resolve_dtype("auto", CPU, None) == torch.float32


def test_at_the_avx2_level_an_engine_never_attempts_packing(smollm2_dir, monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "avx2")

    def refuse(weight):  # what oneDNN does on such a CPU
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support "
                           "avx_ne_convert or avx512bw, avx512vl and avx512dq")

    monkeypatch.setattr(packed_linear, "pack", refuse)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for dtype, expected in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        llm = make_llm(smollm2_dir, dtype=dtype)
        assert llm.llm_engine.engine_core.dtype == expected
        assert llm.llm_engine.engine_core.model.layers[0].qkv.packed is None
        assert len(llm.generate([[1, 504, 3458]], params)[0].outputs[0].token_ids) == 4


@pytest.mark.slow  # CI budget: docs/testing.md
def test_under_onednns_own_avx2_cap_the_engine_loads_and_generates(smollm2_dir, smollm2_llm,
                                                                    chat_prompt_ids):
    """ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN refuse the bf16 packing for real, as on an AVX2
    CPU: the engine (a fresh process) must see it, not pack, and still generate correctly."""
    prompts = chat_prompt_ids[:2]
    env = {k: v for k, v in os.environ.items() if k != OVERRIDE_ENV}
    env.update(ONEDNN_MAX_CPU_ISA="AVX2", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.engine_report", str(smollm2_dir),
         json.dumps(prompts)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["pack_error"] or "").startswith(
        "mkldnn_reorder_linear_weight: bf16 path needs the cpu support")  # the real refusal
    assert report["can_pack"] is False
    assert report["dtype_auto"] == "float32"
    assert report["bfloat16"]["dtype"] == "bfloat16" and not report["bfloat16"]["packed"]
    # fp32 takes the same path with or without the cap: the tokens of the engine held to
    # transformers'. bf16 (a coarser type) must at least agree on each reply's first token.
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    fp32 = [o.outputs[0].token_ids for o in smollm2_llm.generate(prompts, params)]
    assert report["auto"]["tokens"] == fp32
    bf16 = report["bfloat16"]["tokens"]
    assert [len(t) for t in bf16] == [16, 16]
    assert [t[0] for t in bf16] == [t[0] for t in fp32]


def test_auto_says_in_the_log_why_it_chose_float32(monkeypatch, caplog):
    monkeypatch.setenv(OVERRIDE_ENV, "avx2")
    with caplog.at_level(logging.INFO, logger="officellm.engine.precision.dtype_choice"):
        resolve_dtype("auto", CPU, None)
    assert "dtype auto -> float32: this CPU (avx2 fma" in caplog.text
    assert "has no bf16 matrix instructions" in caplog.text

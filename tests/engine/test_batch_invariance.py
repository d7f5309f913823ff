"""--batch-invariant (docs/batch_invariance.md): the same greedy request gives bit-identical
token ids and logprobs alone, again over its cached prefix, in a batch of 16 others, and
prefilled in other chunks; on the bundled model in float32 and bfloat16, on this CPU's best
path and forced to AVX2, dense and over GGUF blocks; with speculation and without (the
Triton path: tests/kernels/test_engine_triton_path.py). Without the mode the same runs differ
(so the comparison can fail), and what cannot keep one order refuses the mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from officellm.engine import SamplingParams
from officellm.engine.config import EngineConfig
from officellm.kernels.cpu_features import OVERRIDE_ENV, cpu_features
from tests.engine.conftest import make_llm

REPO = Path(__file__).resolve().parents[2]
RUNS = ("prefix_hit", "in_batch_of_17", "chunked_by_24")
# (dtype, CPU level cap or None for this CPU's best, extra probe flags)
CONFIGS = {
    "float32-best": ("float32", None, []),
    "bfloat16-best": ("bfloat16", None, []),
    "float32-avx2": ("float32", "avx2", []),
    "bfloat16-avx2": ("bfloat16", "avx2", []),
    "bfloat16-gguf-blocks": ("bfloat16", None, ["--quantization-auto"]),
}
_probed: dict[tuple[str, bool], dict] = {}


def probe(model_dir: Path, config: str, batch_invariant: bool = True) -> dict:
    """tests/support/invariance_probe.py's four runs, in a fresh process (a cap on the CPU's
    level must be set before the kernels load), once per configuration and test process."""
    key = (config, batch_invariant)
    if key not in _probed:
        dtype, cap, flags = CONFIGS[config]
        env = {k: v for k, v in os.environ.items() if k != OVERRIDE_ENV}
        env.update(PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
        if cap is not None:
            env.update({OVERRIDE_ENV: cap, "ONEDNN_MAX_CPU_ISA": cap.upper()})
        args = [*flags, "--batch-invariant"] if batch_invariant else flags
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.invariance_probe", str(model_dir), dtype,
             *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        _probed[key] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _probed[key]


def _avx2_capable() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_features().flags


# float32 at this CPU's best level and bf16 at the AVX2 level are in the slow tier (CI budget,
# docs/testing.md): bf16 at the best level and float32 (the AVX2 default) at AVX2 stay.
SLOW_CONFIGS = ("float32-best", "bfloat16-avx2")


@pytest.mark.parametrize("config", [
    pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CONFIGS else c for c in CONFIGS])
def test_greedy_reply_is_bit_identical_alone_cached_batched_and_chunked(smollm2_dir, config):
    if CONFIGS[config][1] == "avx2" and not _avx2_capable():
        pytest.skip("this CPU has no AVX2 (FMA, F16C): the forced-AVX2 path cannot run here")
    report = probe(smollm2_dir, config)
    alone = report["alone"]
    assert {run: report[run] == alone for run in RUNS} == {run: True for run in RUNS}
    assert report["engine"]["leaked_blocks"] == [0, 0]


def test_gguf_blocks_serve_every_batch_size(smollm2_dir):
    """One kernel for every batch: no switch to the dense weights for large batches."""
    (weights,) = probe(smollm2_dir, "bfloat16-gguf-blocks")["engine"]["weights"]
    assert weights.startswith("in blocks")


@pytest.mark.slow  # CI budget: docs/testing.md
def test_without_the_mode_the_same_runs_differ(smollm2_dir):
    """The comparison above can fail: bf16's near-ties flip without the mode."""
    report = probe(smollm2_dir, "bfloat16-best", batch_invariant=False)
    assert any(report[run]["logprobs"] != report["alone"]["logprobs"] for run in RUNS)


CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n")


def test_speculation_changes_nothing(smollm2_dir):
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
             "prompt_lookup_max": 4}
    params = SamplingParams(temperature=0.0, max_tokens=48, logprobs=1)
    chat = [{"role": "user", "content": "Repeat this code exactly, then stop:\n" + CODE}]
    replies = {}
    for name, extra in (("plain", {}), ("speculating", {"speculative_config": ngram})):
        llm = make_llm(smollm2_dir, dtype="bfloat16", batch_invariant=True, **extra)
        out = llm.generate([llm.apply_chat_template(chat)], params)[0].outputs[0]
        replies[name] = (out.token_ids, [lp[t].logprob for lp, t in zip(out.logprobs,
                                                                        out.token_ids)])
        if extra:
            assert llm.llm_engine.stats().spec_decode_num_accepted_tokens > 0  # drafts kept
    assert replies["speculating"] == replies["plain"]


def test_the_torch_backend_refuses_the_mode(smollm2_dir):
    with pytest.raises(ValueError, match="--batch-invariant needs the cpu or triton backend"):
        make_llm(smollm2_dir, attention_backend="torch", batch_invariant=True)


def test_float16_on_the_cpu_refuses_the_mode(smollm2_dir):
    with pytest.raises(ValueError, match="runs float32 or bfloat16 matmuls"):
        make_llm(smollm2_dir, dtype="float16", batch_invariant=True)


def test_more_than_two_tensor_parallel_ranks_refuse_the_mode():
    with pytest.raises(ValueError, match="tensor_parallel_size 1 or 2, not 4"):
        EngineConfig(batch_invariant=True, tensor_parallel_size=4)

"""The Triton kernels compile for the GPUs officellm serves on (sm_80, sm_89, sm_90), on this
machine without one: the interpreter the other kernel tests use runs a kernel as Python, so
a kernel no GPU compiler accepts passed them all (the int8 KV tile did).
kernels/triton/compile_check.py runs in a process of its own (the kernels here are decorated
for the interpreter); see it for how."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("triton")
ARCHS = (80, 89, 90)


def _compile_check(level: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "officellm.kernels.triton.compile_check",
         "--arch", ",".join(map(str, ARCHS)), "--level", level],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    assert out.stdout, out.stderr[-4000:]
    report = json.loads(out.stdout)
    report["returncode"] = out.returncode
    return report


MOE_KERNELS = ("_moe_count_kernel", "_moe_place_kernel", "_moe_gate_up_kernel",
               "_moe_down_kernel")


def test_the_attention_rotary_kv_write_and_moe_kernels_compile_for_every_target():
    """Attention over an int8 cache, the rotary + KV write, and the MoE experts (gpt-oss's
    MXFP4 decode)."""
    report = _compile_check("smoke")
    assert report["problems"] == [] and report["returncode"] == 0
    compiled = {(v["arch"], v["kernel"]) for v in report["variants"]}
    assert compiled == {(arch, kernel) for arch in ARCHS
                        for kernel in ("_decode_kernel", "_merge_kernel", "_prefill_kernel",
                                       "_rotary_write_kv_kernel", *MOE_KERNELS)}


# On A100 (sm_80) alone these 16-bit variants spill a few bytes per thread (docs/gpu.md):
# known, left until an A100 can measure a smaller tile. Any other problem, or a larger
# spill, fails.
KNOWN_SM80_SPILLS = {
    f"sm_80 {case}" for case in (
        "prefill qwen2.5-7b q float16 cache float16 1024 tokens _prefill_kernel: spills 12 B",
        "prefill qwen2.5-7b q bfloat16 cache bfloat16 1024 tokens _prefill_kernel: spills 12 B",
        "decode qwen2.5-7b q float16 cache int8 splits 1 _decode_kernel: spills 16 B",
        "decode qwen2.5-7b q bfloat16 cache int8 splits 1 _decode_kernel: spills 16 B")}


@pytest.mark.slow
def test_every_kernel_variant_compiles_fits_and_16_bit_queries_do_not_spill():
    report = _compile_check("standard")
    assert set(report["problems"]) <= KNOWN_SM80_SPILLS, report["problems"]
    kernels = {v["kernel"] for v in report["variants"]}
    assert kernels == {"_decode_kernel", "_merge_kernel", "_prefill_kernel", "_write_kv_kernel",
                       "_rms_norm_kernel", "_gated_activation_kernel", "_rotary_kernel",
                       "_rotary_write_kv_kernel", "_fixed_order_matmul_kernel", *MOE_KERNELS}

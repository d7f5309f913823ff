"""The benchmarks still run: each script, on the smallest settings, ends with its JSON written.

Their numbers are not checked here (speed is measured in benchmarks, not in timed tests); what
is checked is that a refactor of the engine or the server did not leave a script calling a name
that is gone, as the pipeline refactor once did (offline_throughput read LLMEngine.dtype).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(args: list[str], out: Path, timeout: float = 300) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_offline_throughput_runs(tmp_path: Path) -> None:
    doc = _run(["benchmarks/offline_throughput.py", "--requests", "2", "--threads", "1",
                "--skip", "hf_generate", "hf_generate_batch"], tmp_path / "offline.json")
    assert doc["results"]["engine"]["output_tok_per_s"] > 0


def test_kv_cache_quality_runs(tmp_path: Path) -> None:
    doc = _run(["benchmarks/kv_cache_quality.py", "--kv-dtypes", "float16", "fp8_e4m3",
                "--max-tokens", "24", "--threads", "1"], tmp_path / "kvq.json")
    fp8 = next(r for r in doc["runs"] if r["kv_cache_dtype"] == "fp8_e4m3")
    assert fp8["bytes_per_token"] == 11_520 and 0 <= fp8["top1_agreement_vs_float16"] <= 1


def test_quant_matmul_speed_runs(tmp_path: Path) -> None:
    doc = _run(["benchmarks/quant_matmul_speed.py", "--isa", "native", "--shape", "64", "256",
                "--rows", "1", "2", "--repeats", "1", "--threads", "1"], tmp_path / "qmm.json")
    times = doc["paths"]["native"]["rows"]["2"]
    assert {"dense float32", "dense bfloat16", "Q4_K", "Q6_K"} <= set(times)


def test_moe_kernel_speed_runs(tmp_path: Path) -> None:
    doc = _run(["benchmarks/moe_kernel_speed.py", "--isa", "native", "--experts", "8",
                "--layers", "1", "--calls", "1", "--tokens", "1", "--bandwidth-gib", "0.05",
                "--threads", "1"], tmp_path / "moe.json")
    mixes = doc["paths"]["native"]["mixes"]
    assert mixes["MXFP4"]["rows"]["tokens"]["1"]["ms"] > 0


def test_step_overhead_runs(tmp_path: Path) -> None:
    doc = _run(["-m", "benchmarks.step_overhead", "--batches", "2", "--steps", "2"],
               tmp_path / "step.json")
    assert [row["batch"] for row in doc["results"]] == [2]


def test_compare_cpu_runs_officellm_alone(tmp_path: Path) -> None:
    doc = _run(["benchmarks/compare_cpu.py", "--systems", "officellm", "--scenarios", "office",
                "--users", "1", "--duration", "3", "--max-tokens", "4", "--ctx-per-slot", "1024",
                "--max-load", "100", "--idle-timeout", "0"], tmp_path / "cmp.json")
    requests = doc["results"]["officellm"]["office-1"]["summary"]["requests"]
    assert requests["completed"] > 0 and requests["errors"] == 0
    assert doc["machine"]["model"] and doc["machine"]["cores"]
    chosen = doc["officellm_startup"]  # what it chose at start, kept with the numbers
    assert any("Loaded " in line and "KV cache" in line for line in chosen), chosen
    assert any("KV cache size:" in line for line in chosen), chosen
    assert any("Resident memory after load:" in line for line in chosen), chosen


def test_agent_prefix_runs(tmp_path: Path) -> None:
    doc = _run(["-m", "benchmarks.agent_prefix", "--tools", "2", "--threads", "1"],
               tmp_path / "agent.json")
    assert len(doc["runs"]) == 3 and doc["prompt_tokens"] > 0
    assert doc["runs"][1]["cache_read_input_tokens"] > 0


def test_vision_runs(tmp_path: Path) -> None:
    doc = _run(["benchmarks/vision.py", "--smoke", "--threads", "1", "--batches", "1", "2"],
               tmp_path / "vision.json")
    assert [r["run"] for r in doc["tower"]] == ["transformers, batch 1", "engine, batch 1",
                                                "transformers, batch 2", "engine, batch 2"]
    assert all(r["images_per_s"] > 0 for r in doc["tower"])
    engine = next(r for r in doc["ttft"] if r["run"] == "engine LLM")
    assert engine["ttft_s"] > 0 and engine["first_token_equals_transformers"]
    assert (tmp_path / "vision.png").is_file()

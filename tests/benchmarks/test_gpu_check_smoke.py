"""benchmarks/gpu_check.sh, the one script a lent GPU runs, runs green in its CPU smoke mode:
it cannot rot between GPU sessions (the pipeline refactor once left three of its sections
calling engine attributes that were gone, unnoticed until a GPU was lent)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("a_kernels", "b_parity", "c_decode", "d_throughput", "e_startup", "f_kv_tiers",
            "v_vision")


def _smoke(tmp_path: Path, sections: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--sections", sections],
                          cwd=REPO, env=dict(env, OUT=str(tmp_path), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check_cpu_smoke.json").read_text())
    assert (tmp_path / "gpu_check_cpu_smoke.md").is_file()
    return report


def test_the_engine_sections_run_green_without_a_gpu(tmp_path: Path) -> None:
    """Start-up and decode: the sections that drive the engine's own API (~10 s; parity and
    the throughput race with transformers take a minute: the slow run)."""
    report = _smoke(tmp_path, "ce")
    assert report["e_startup"]["kv_cache_tokens"] > 0
    # On the CPU the pool is a fixed --kv-cache-memory: the plan for weights + that memory
    # must give the same pool, within a block per layer's rounding.
    assert report["e_startup"]["pool_vs_plan"] == pytest.approx(1.0, abs=0.05)
    assert report["c_decode"]["rows"]
    # Every row also times the serial loop (async scheduling off, then on again).
    assert all(row["serial_step_ms"] > 0 for row in report["c_decode"]["rows"])
    assert not any("error" in report[key] for key in ("c_decode", "e_startup"))
    assert "d_throughput" not in report  # a section not asked for is not run


def test_the_kv_tiers_section_preempts_and_copies_back_with_the_same_tokens(
        tmp_path: Path) -> None:
    """(f), ~5 s: the host and disk tiers under a pool too small for the batch."""
    tiers = _smoke(tmp_path, "f")["f_kv_tiers"]
    assert tiers["identical"] and tiers["ok"]
    assert tiers["preemptions_with_tiers"] > 0 and tiers["tier_hit_tokens"] > 0
    assert tiers["prompt_tokens_computed_with"] < tiers["prompt_tokens_computed_without"]


@pytest.mark.slow
def test_every_section_runs_green_without_a_gpu(tmp_path: Path) -> None:
    report = _smoke(tmp_path, "abcdefv")
    assert report["a_kernels"]["all_ok"] and report["b_parity"]["float32"]["identical"]
    # Images: the CPU's default backend and the torch one give transformers' tokens.
    assert report["v_vision"]["ok"] and report["v_vision"]["images_change_the_answer"]
    assert not any("error" in report[key] for key in SECTIONS)
    engine = report["d_throughput"]["engine"]
    assert 0 < engine["ttft_ms"]["p50"] <= engine["ttft_ms"]["p99"]
    assert 0 < engine["itl_ms"]["p50"] <= engine["itl_ms"]["p99"]


def test_each_section_is_saved_as_soon_as_it_ends(tmp_path: Path) -> None:
    """A check cut short by its time limit keeps what it measured before."""
    import benchmarks.gpu_check as gpu_check

    def saved() -> tuple[dict, str]:
        (json_file,) = tmp_path.glob("*.json")
        return json.loads(json_file.read_text()), json_file.with_suffix(".md").read_text()

    report = {"meta": {"device": "test", "smoke": True, "out_dir": str(tmp_path)}}
    gpu_check._section(report, "a_kernels", lambda: {"skipped": "not in this test"})
    assert saved()[0]["a_kernels"] == {"skipped": "not in this test"}
    gpu_check._section(report, "b_parity", lambda: 1 / 0)  # a failing section is saved too
    data, text = saved()
    assert data["b_parity"] == {"error": "ZeroDivisionError: division by zero"}
    assert "ERROR ZeroDivisionError" in text

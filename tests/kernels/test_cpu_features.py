"""officellm.kernels.cpu_features: the CPU's flags, lowered by OFFICELLM_CPU_ISA or oneDNN's own cap."""

from __future__ import annotations

import os

import pytest

from officellm.kernels.cpu_features import cpu_features

SAPPHIRE_RAPIDS = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw",
                             "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                             "amx_tile", "amx_int8", "amx_bf16", "avx_vnni"})
SKYLAKE_SP = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw",
                        "avx512vl", "avx512dq"})
HASWELL = frozenset({"sse4_2", "avx", "avx2", "fma"})
SIERRA_FOREST = HASWELL | {"avx_vnni", "avx_ne_convert", "avx_vnni_int8"}


@pytest.mark.parametrize("flags, pack, compute", [
    (SAPPHIRE_RAPIDS, True, True),
    (SKYLAKE_SP, True, False),
    (HASWELL, False, False),
    (SIERRA_FOREST, True, False),  # AVX-NE-CONVERT: oneDNN packs bf16 without AVX-512
    (frozenset({"avx512bw", "avx512vl"}), False, False),  # DQ missing
])
def test_what_each_cpu_can_do(flags, pack, compute):
    f = cpu_features({}, native=flags)
    assert (f.can_pack_bf16, f.has_bf16_compute) == (pack, compute)
    assert f.flags == flags and f.cap is None


@pytest.mark.parametrize("level, pack, compute", [
    ("avx2", False, False), ("AVX2", False, False), ("avx512_core", True, False),
    ("avx512_core_bf16", True, True), ("avx512_core_amx", True, True), ("all", True, True),
])
def test_the_override_lowers_the_cpu_to_a_level(level, pack, compute):
    f = cpu_features({"OFFICELLM_CPU_ISA": level}, native=SAPPHIRE_RAPIDS)
    assert (f.can_pack_bf16, f.has_bf16_compute) == (pack, compute)


def test_avx2_keeps_the_baseline_and_drops_everything_above_it():
    f = cpu_features({"OFFICELLM_CPU_ISA": "avx2"}, native=SAPPHIRE_RAPIDS)
    assert f.flags == HASWELL
    assert f.cap == "OFFICELLM_CPU_ISA=avx2" and "capped by OFFICELLM_CPU_ISA=avx2" in f.describe()


def test_a_level_never_adds_what_the_cpu_lacks():
    assert cpu_features({"OFFICELLM_CPU_ISA": "avx512_core_amx"}, native=HASWELL).flags == HASWELL


def test_onednns_own_cap_counts_too_and_the_lower_cap_wins():
    assert not cpu_features({"ONEDNN_MAX_CPU_ISA": "AVX2"}, native=SKYLAKE_SP).can_pack_bf16
    assert not cpu_features({"DNNL_MAX_CPU_ISA": "AVX2"}, native=SKYLAKE_SP).can_pack_bf16
    both = cpu_features({"OFFICELLM_CPU_ISA": "avx512_core_bf16", "ONEDNN_MAX_CPU_ISA": "avx2"},
                        native=SAPPHIRE_RAPIDS)
    assert both.flags == HASWELL
    # oneDNN reads ONEDNN_ before DNNL_, and ignores a value it does not know: so do we.
    assert cpu_features({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "DNNL_MAX_CPU_ISA": "AVX2"},
                        native=SKYLAKE_SP).can_pack_bf16
    assert cpu_features({"ONEDNN_MAX_CPU_ISA": "no-such-isa"}, native=SKYLAKE_SP).flags == SKYLAKE_SP


def test_an_unknown_override_is_an_error():
    with pytest.raises(ValueError, match="OFFICELLM_CPU_ISA='avx3' is not a CPU level"):
        cpu_features({"OFFICELLM_CPU_ISA": "avx3"}, native=HASWELL)


def test_the_bf16_pack_answer_agrees_with_onednns_own(monkeypatch):
    """On this machine, and under oneDNN's AVX2 cap (read by oneDNN at its first use, so in
    a fresh process): our answer is torch's oneDNN's, is_mkldnn_bf16_supported."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if not hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported"):
        pytest.skip("this torch cannot say whether its oneDNN supports bf16")
    probe = ("import json, torch; from officellm.kernels.cpu_features import cpu_features; "
             "print(json.dumps([cpu_features().can_pack_bf16, "
             "torch.ops.mkldnn._is_mkldnn_bf16_supported()]))")
    repo = Path(__file__).resolve().parents[2]
    for cap in (None, "AVX2"):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OFFICELLM_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
        if cap:
            env["ONEDNN_MAX_CPU_ISA"] = cap
        env["PYTHONPATH"] = str(repo)
        out = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env, check=True,
                             capture_output=True, text=True).stdout
        ours, onednns = json.loads(out)
        assert ours == onednns, cap


def test_without_proc_cpuinfo_torchs_probe_answers(monkeypatch, tmp_path):
    """Not Linux: torch's capability probe (AVX512 / AVX2 / none); no bf16 compute claimed."""
    import torch

    import officellm.kernels.cpu_features as cf

    monkeypatch.setattr(cf, "CPUINFO", tmp_path / "no-cpuinfo")
    f = cpu_features({})
    capability = torch.backends.cpu.get_cpu_capability()
    assert f.can_pack_bf16 == capability.startswith("AVX512")
    assert ("avx2" in f.flags) == capability.startswith(("AVX2", "AVX512"))
    assert not f.has_bf16_compute


def test_a_level_below_avx2_takes_avx2_away_too():
    """OFFICELLM_CPU_ISA=sse41 stands for a pre-AVX2 CPU (the kernels' portable build)."""
    f = cpu_features({"OFFICELLM_CPU_ISA": "sse41"}, native=HASWELL)
    assert not {"avx2", "fma", "f16c"} & f.flags

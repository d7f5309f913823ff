"""What a benchmark ran on: the CPU's model and the instruction-set flags that pick kernels."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

# The flags that decide which kernels and dtypes can run (the rest of /proc/cpuinfo's list
# says nothing about speed here).
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
             "avx512_vnni", "avx512_bf16", "avx_vnni", "avx_ne_convert", "amx_bf16",
             "amx_int8", "amx_tile")
# The variables that make this machine run as a lesser CPU (ours, oneDNN's, MKL's): a run
# under any of them is the forced-AVX2 stand-in, not this CPU at its best.
ISA_CAPS = ("OFFICELLM_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


# torch's MKL cap for each OFFICELLM_CPU_ISA value (MKL's sgemm dispatches by itself).
MKL_LEVELS = {"avx2": "AVX2", "sse41": "SSE4_2"}


def run_per_isa(script: str, isas: list[str], threads: int, argv: list[str]) -> dict:
    """{isa: the JSON its last stdout line holds} of `script argv` run once per path, each in
    a process of its own on `threads` threads: "native" as this CPU is, any other an
    OFFICELLM_CPU_ISA value capping our kernels, oneDNN's and MKL's alike."""
    paths = {}
    for isa in isas:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        for cap in ISA_CAPS:
            env.pop(cap, None)
        if isa != "native":
            env.update(OFFICELLM_CPU_ISA=isa, ONEDNN_MAX_CPU_ISA=isa.upper())
            if isa in MKL_LEVELS:
                env["MKL_ENABLE_INSTRUCTIONS"] = MKL_LEVELS[isa]
        proc = subprocess.run([sys.executable, script, *argv], env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{script} ({isa}) failed:\n{proc.stderr[-3000:]}")
        paths[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
    return paths


def isa_caps() -> dict[str, str]:
    """The ISA_CAPS set in this process's environment."""
    return {k: os.environ[k] for k in ISA_CAPS if k in os.environ}


def cpu_description() -> dict:
    """{"model", "isa_flags", "cores"} of this machine (Linux /proc/cpuinfo; else platform)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "isa_flags": [f for f in ISA_FLAGS if f in flags],
            "cores": os.cpu_count()}


def read_bandwidth(nbytes: int = 2 * 1024**3, iters: int = 5) -> float:
    """Bytes read per second summing a float32 buffer far larger than the caches (on the
    threads torch has: set them first)."""
    import time

    import torch

    buf = torch.ones(nbytes // 4)
    buf.sum()  # warm-up (pages touched)
    t0 = time.perf_counter()
    for _ in range(iters):
        buf.sum()
    return nbytes * iters / (time.perf_counter() - t0)

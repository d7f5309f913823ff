"""Which CPU instruction-set features the engine may use on this machine.

The one place that answers it: `cpu_features()` reads the CPU's flags (Linux /proc/cpuinfo;
elsewhere torch's own probe) and lowers them to a cap, if one is set:

- OFFICELLM_CPU_ISA: ours, so a test (or an operator) can make this machine behave as a
  lesser CPU, e.g. `avx2` for an AVX2-only one with no AVX-512 and no bf16 instructions.
- ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA): oneDNN's own cap, which torch's
  oneDNN obeys; with `AVX2` it refuses the bf16 weight packing exactly as an AVX2-only CPU
  does, so the engine must not attempt it either.

Both take oneDNN's level names, case-insensitive (see ISA_LEVELS); with both, the lower
wins. A cap never adds a feature the CPU lacks. An unknown OFFICELLM_CPU_ISA is an error; an
unknown oneDNN value is ignored here, as oneDNN ignores it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

OVERRIDE_ENV = "OFFICELLM_CPU_ISA"
ONEDNN_ENVS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
CPUINFO = Path("/proc/cpuinfo")

# What oneDNN needs to pack a bf16 linear weight (its refusal: "bf16 path needs the cpu
# support avx_ne_convert or avx512bw, avx512vl and avx512dq").
BF16_PACK_AVX512 = frozenset({"avx512bw", "avx512vl", "avx512dq"})
BF16_PACK_AVX2 = "avx_ne_convert"
# bf16 matrix instructions: what makes a bf16 matmul faster than fp32 (else it is emulated).
BF16_COMPUTE = ("avx512_bf16", "amx_bf16")

_AVX512_CORE = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512vl", "avx512dq"})
_AVX2_VNNI_2 = frozenset({"avx_vnni", "avx_ne_convert", "avx_vnni_int8"})
# oneDNN's ISA names (lower case), each with the flags above AVX2 it allows. None: no cap.
ISA_LEVELS: dict[str, frozenset[str] | None] = {
    "sse41": frozenset(),
    "avx": frozenset(),
    "avx2": frozenset(),
    "avx2_vnni": frozenset({"avx_vnni"}),
    "avx2_vnni_2": _AVX2_VNNI_2,
    "avx512_core": _AVX512_CORE,
    "avx512_core_vnni": _AVX512_CORE | {"avx512_vnni"},
    "avx512_core_bf16": _AVX512_CORE | {"avx512_vnni", "avx512_bf16"},
    "avx512_core_amx": _AVX512_CORE | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                                       "amx_bf16"},
    "default": None,
    "all": None,
}


def _above_avx2(flag: str) -> bool:
    """A flag a cap can take away: AVX-512, AMX, AVX10 and the AVX2-era extensions."""
    return flag.startswith(("avx512", "amx", "avx10", "avx_"))


# What the levels below AVX2 take away as well (the C++ kernels' portable build).
_AVX2_ERA = frozenset({"avx2", "fma", "f16c"})
_BELOW_AVX2 = ("sse41", "avx")


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU flags the engine may use (after any cap), and the decisions that read them."""

    flags: frozenset[str]
    cap: str | None = None  # e.g. "OFFICELLM_CPU_ISA=avx2", when a cap lowered the flags

    @property
    def can_pack_bf16(self) -> bool:
        """oneDNN can lay out bf16 linear weights (engine.models.packed_linear)."""
        return BF16_PACK_AVX512 <= self.flags or BF16_PACK_AVX2 in self.flags

    @property
    def has_bf16_compute(self) -> bool:
        """AVX512-BF16 or AMX-BF16: bf16 matmuls run natively, not emulated."""
        return any(f in self.flags for f in BF16_COMPUTE)

    def describe(self) -> str:
        """The CPU in a few words, for logs and skip reasons."""
        notable = sorted(f for f in self.flags if _above_avx2(f) or f in ("avx2", "fma"))
        what = " ".join(notable) if notable else "no AVX2 or later"
        return f"{what} (capped by {self.cap})" if self.cap else what


def _level(name: str, variable: str, strict: bool) -> frozenset[str] | None:
    key = name.strip().lower()
    if key not in ISA_LEVELS:
        if strict:
            raise ValueError(f"{variable}={name!r} is not a CPU level; use one of "
                             f"{', '.join(ISA_LEVELS)}.")
        return None
    return ISA_LEVELS[key]


def _native_flags() -> frozenset[str]:
    """The CPU's flags: /proc/cpuinfo's first `flags` line, else torch's capability probe."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    import torch  # not Linux: torch knows at least whether AVX-512 or AVX2 is there

    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return frozenset({"avx2", "fma"}) | _AVX512_CORE
    return frozenset({"avx2", "fma"}) if capability.startswith("AVX2") else frozenset()


def cpu_features(environ: Mapping[str, str] | None = None,
                 native: frozenset[str] | None = None) -> CpuFeatures:
    """This machine's CPU features after the caps in `environ` (default: os.environ).

    `native` replaces the CPU's own flags (for tests of this function). Read afresh on every
    call (a fraction of a millisecond): a cap set by a test applies at once.
    """
    env = os.environ if environ is None else environ
    flags = _native_flags() if native is None else native
    caps: list[tuple[str, frozenset[str]]] = []
    if env.get(OVERRIDE_ENV):
        allowed = _level(env[OVERRIDE_ENV], OVERRIDE_ENV, strict=True)
        if allowed is not None:
            caps.append((f"{OVERRIDE_ENV}={env[OVERRIDE_ENV]}", allowed))
    for variable in ONEDNN_ENVS:
        if env.get(variable):
            allowed = _level(env[variable], variable, strict=False)
            if allowed is not None:
                caps.append((f"{variable}={env[variable]}", allowed))
            break  # oneDNN reads the first one set
    for _, allowed in caps:
        flags = frozenset(f for f in flags if not _above_avx2(f) or f in allowed)
    if env.get(OVERRIDE_ENV, "").strip().lower() in _BELOW_AVX2:
        flags = flags - _AVX2_ERA
    return CpuFeatures(flags, ", ".join(name for name, _ in caps) or None)

"""Every Triton kernel variant the engine launches, compiled for a CUDA GPU on a machine that
has none: `python -m officellm.kernels.triton.compile_check --arch 80,89,90`.

The kernel tests run the kernels under Triton's interpreter, which executes them as Python:
a kernel that no GPU compiler accepts passes every one of them (the int8 KV tile returned
two types from one function until this check compiled it). Here the kernels' own wrappers
are called, as the engine calls them, with CPU tensors of the shapes and dtypes a GPU run
would give them, while Triton believes it drives a GPU of the given compute capability:
each launch compiles the variant (Triton to PTX to a cubin with the ptxas Triton ships) and
then does not run. ptxas run once more with -v reports each variant's registers and spills;
the shared memory a variant needs is checked against the architecture's limit per block.

Needs TRITON_INTERPRET unset (a kernel decorated under the interpreter cannot be compiled):
run it as its own process, as tests/kernels/test_triton_compiles.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from officellm.kernels.triton import E4M3_MIN_CAPABILITY

# Shared memory one block may use (bytes), by compute capability: A100 (8.0), Ada (8.9), Hopper.
MAX_SHARED = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}
# (query heads, KV heads, head size): Qwen2.5-7B-Instruct's (the main case) and SmolLM2-135M's.
HEAD_LAYOUTS = {"qwen2.5-7b": (28, 4, 128), "smollm2-135m": (9, 3, 64)}
# The families whose attention has more than full causal attention, with their heads, sliding
# window and whether they have sinks: a Gemma-3-like layout (sliding layers of 1,024 keys
# between full ones, head size 256) and gpt-oss's (128-key sliding layers between full ones,
# sinks on every layer). Each is compiled both ways, windowed and full.
FEATURE_LAYOUTS = {"gemma3-like": (8, 4, 256, 1024, False), "gpt-oss": (64, 8, 64, 128, True)}
# Partial rotary (query heads, KV heads, head size, rotated width): Phi-4-mini's.
PARTIAL_ROTARY = {"phi-4-mini": (24, 8, 128, 96)}
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The caches a query dtype meets (--kv-cache-dtype): its own, the one-byte ones, and a float32
# model's 16-bit caches.
ONE_BYTE_CACHES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
DECODE_SPLITS = (1, 2, 4, 8, 16)  # every split count default_num_splits can choose
PREFILL_QUERY_TOKENS = (1, 2, 1024, 8192)
PAGE = 16
# The dense layers fixed_order_matmul (--batch-invariant) runs, per model: hidden size, qkv
# output, MLP intermediate size, and whether qkv has a bias (Qwen2's does).
MATMUL_SHAPES = {"qwen2.5-7b": (3584, 4608, 18944, True),
                 "smollm2-135m": (576, 960, 1536, False)}
MATMUL_ROWS = (1, 1024)  # a decode step and a prefill chunk: M must not change the variant
# The MoE layers moe_experts runs: experts, top k, hidden size, expert intermediate size, the
# activation, whether the experts have biases, and their weights' forms (gpt-oss ships
# MXFP4; dense is its dequantized checkpoint). The activation and the biases are runtime
# arguments (one variant serves all); the tiles (decode or prefill), the dtype and dense vs
# MXFP4 make the variants, and the dense ones are shared by both shapes.
MOE_SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False, ("dense",)),
              "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu", True, ("dense", "mxfp4"))}
MOE_TOKENS = (1, 1024)  # decode tiles, prefill tiles


@dataclass(frozen=True)
class Variant:
    """One compiled kernel variant and what ptxas says of it."""

    case: str  # the wrapper call that launched it
    kernel: str
    arch: int
    shared: int
    registers: int
    spill_bytes: int
    error: str = ""


def caches_for(q_dtype: torch.dtype, arch: int) -> tuple[torch.dtype, ...]:
    """The KV-cache dtypes a model computing in q_dtype can store on compute capability
    `arch` (no e4m3 below E4M3_MIN_CAPABILITY: the engine refuses it there)."""
    own = (torch.bfloat16, torch.float16) if q_dtype == torch.float32 else ()
    one_byte = tuple(c for c in ONE_BYTE_CACHES if c != torch.float8_e4m3fn
                     or divmod(arch, 10) >= E4M3_MIN_CAPABILITY)
    return (q_dtype, *own, *one_byte)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _StandInDriver:
    """What Triton's JIT asks of the active driver before it compiles, for a GPU absent."""

    def __init__(self, target) -> None:  # type: ignore[no-untyped-def]
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):  # type: ignore[no-untyped-def]
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


@contextlib.contextmanager
def _compiling_for(arch: int) -> Iterator[list[tuple[str, object]]]:
    """Within: every kernel launch compiles for sm_`arch` and returns without running; the
    list collects (kernel name, compiled kernel)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    compiled: list[tuple[str, object]] = []
    original = JITFunction.run
    retargeted: set[int] = set()

    def compile_only(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
        if id(self) not in retargeted:
            # A JIT function caches the target with its kernels, per device (always 0 here):
            # left alone, every architecture after a process's first reused the first one's
            # kernels (--arch 80,89,90 reported sm_80 code three times).
            retargeted.add(id(self))
            self.device_caches.clear()
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    # Not reset afterwards: on a machine without a GPU there is no driver to go back to.
    driver.set_active(_StandInDriver(GPUTarget("cuda", arch, 32)))
    try:
        yield compiled
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


def _cache(blocks: int, hk: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    width = d + 4 if dtype == torch.int8 else d
    return torch.zeros(blocks, PAGE, hk, width, dtype=dtype)


# How much of the matrix a run compiles (each variant takes ~3 s on a small CPU):
# smoke: the attention kernels and the rotary + KV write over an int8 cache with bf16
# queries, Qwen2.5-7B's heads, and with bf16 queries over a bf16 cache the sliding-window
# (and sinks) attention of FEATURE_LAYOUTS and the partial rotary + KV write (the CI default
# run); standard: every kernel x query dtype x cache dtype, Qwen2.5-7B's heads (the rotary +
# KV write: both models' heads), 1 and 4 splits, prefill of 1 and 1,024 tokens, and
# FEATURE_LAYOUTS' attention windowed and full for 16-bit queries over their own and an int8
# cache (~170 variants); full: also SmolLM2's heads everywhere, every split count and 2 and
# 8,192 tokens, and FEATURE_LAYOUTS for every query and cache dtype.
LEVELS = ("smoke", "standard", "full")


def _cases(level: str, arch: int) -> Iterator[tuple[str, object]]:
    """(description, a call of one wrapper) for each variant of `level` (LEVELS)."""
    from officellm.kernels.triton import ops

    full, smoke = level == "full", level == "smoke"
    layouts = HEAD_LAYOUTS if full else dict(list(HEAD_LAYOUTS.items())[:1])
    splits = DECODE_SPLITS if full else (4,) if smoke else (1, 4)
    prefill = PREFILL_QUERY_TOKENS if full else (1024,) if smoke else (1, 1024)
    yield from _rotary_write_kv_cases(ops, smoke, arch)
    yield from _feature_cases(ops, level, arch)
    for layout, (hq, hk, d) in layouts.items():
        for q_dtype in (torch.bfloat16,) if smoke else QUERY_DTYPES:
            if smoke:
                yield from _attention_cases(ops, layout, hq, hk, d, q_dtype, torch.int8,
                                            splits, prefill)
                continue
            x = torch.zeros(4, hq * d, dtype=q_dtype)
            yield (f"rms_norm {layout} {_name(q_dtype)}",
                   lambda x=x: ops.fused_add_rms_norm(x, x.clone(), x[0].clone(), 1e-6))
            gate_up = torch.zeros(4, 2 * 18944 if layout == "qwen2.5-7b" else 2 * 1536,
                                  dtype=q_dtype)
            yield f"silu_and_mul {layout} {_name(q_dtype)}", lambda g=gate_up: ops.silu_and_mul(g)
            yield (f"gelu_tanh_and_mul {layout} {_name(q_dtype)}",
                   lambda g=gate_up: ops.gelu_tanh_and_mul(g))
            qk = torch.zeros(4, hq + hk, d, dtype=q_dtype)
            cos = torch.zeros(4, d, dtype=q_dtype)
            yield (f"rotary {layout} {_name(q_dtype)}",
                   lambda qk=qk, cos=cos, h=hq: ops.apply_rotary(qk[:, :h], qk[:, h:], cos, cos))
            for cache_dtype in caches_for(q_dtype, arch):
                kv = torch.zeros(4, hk, d, dtype=q_dtype)
                kc, vc = _cache(64, hk, d, cache_dtype), _cache(64, hk, d, cache_dtype)
                slots = torch.arange(4, dtype=torch.long)
                yield (f"write_kv_cache {layout} q {_name(q_dtype)} cache {_name(cache_dtype)}",
                       lambda kv=kv, kc=kc, vc=vc, s=slots: ops.write_kv_cache(kv, kv, kc, vc, s))
                yield from _attention_cases(ops, layout, hq, hk, d, q_dtype, cache_dtype,
                                            splits, prefill)
    if not smoke:
        yield from _matmul_cases(ops)
    yield from _moe_cases(ops, smoke)


def _rotary_write_kv_cases(ops, smoke: bool, arch: int) -> Iterator[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """The rotary fused with the KV write (every layer's first kernel), for write_kv_cache's
    query x cache dtypes and both models' heads (its blocks follow the head counts); smoke:
    bf16 queries over an int8 cache, Qwen2.5-7B's heads."""
    layouts = dict(list(HEAD_LAYOUTS.items())[:1]) if smoke else HEAD_LAYOUTS
    for layout, (hq, hk, d) in layouts.items():
        for q_dtype in (torch.bfloat16,) if smoke else QUERY_DTYPES:
            q = torch.zeros(4, hq, d, dtype=q_dtype)
            kv = torch.zeros(4, hk, d, dtype=q_dtype)
            cos = torch.zeros(4, d, dtype=torch.float32)  # the rotary table's dtype
            slots = torch.arange(4, dtype=torch.long)
            for cache_dtype in (torch.int8,) if smoke else caches_for(q_dtype, arch):
                kc, vc = _cache(64, hk, d, cache_dtype), _cache(64, hk, d, cache_dtype)
                yield (f"rotary_write_kv {layout} q {_name(q_dtype)} cache {_name(cache_dtype)}",
                       lambda q=q, kv=kv, cos=cos, kc=kc, vc=vc, s=slots:
                       ops.rotary_write_kv(q, kv, kv, cos, cos, kc, vc, s))


def _feature_cases(ops, level: str, arch: int) -> Iterator[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """FEATURE_LAYOUTS' attention (windowed with their window and full, with their sinks) and
    PARTIAL_ROTARY's rotary (+ KV write), for LEVELS' dtypes."""
    smoke, full = level == "smoke", level == "full"
    q_dtypes = (torch.bfloat16,) if smoke else QUERY_DTYPES if full else (torch.bfloat16,
                                                                          torch.float16)
    for layout, (hq, hk, d, window, has_sinks) in FEATURE_LAYOUTS.items():
        for q_dtype in q_dtypes:
            caches = ((q_dtype,) if smoke else caches_for(q_dtype, arch) if full
                      else (q_dtype, torch.int8))
            for cache_dtype in caches:
                for w in (window,) if smoke else (window, 0):
                    yield from _attention_cases(
                        ops, layout, hq, hk, d, q_dtype, cache_dtype,
                        DECODE_SPLITS if full else (4,) if smoke else (1, 4),
                        PREFILL_QUERY_TOKENS if full else (1024,), window=w,
                        sinks=torch.zeros(hq) if has_sinks else None)
    for layout, (hq, hk, d, r) in PARTIAL_ROTARY.items():
        for q_dtype in (torch.bfloat16,) if smoke else QUERY_DTYPES:
            q = torch.zeros(4, hq, d, dtype=q_dtype)
            kv = torch.zeros(4, hk, d, dtype=q_dtype)
            cos = torch.zeros(4, r, dtype=torch.float32)
            slots = torch.arange(4, dtype=torch.long)
            if not smoke:
                yield (f"rotary {layout} {_name(q_dtype)} partial",
                       lambda q=q, kv=kv, cos=cos: ops.apply_rotary(q, kv, cos, cos))
            for cache_dtype in (q_dtype,) if smoke else caches_for(q_dtype, arch):
                kc, vc = _cache(64, hk, d, cache_dtype), _cache(64, hk, d, cache_dtype)
                yield (f"rotary_write_kv {layout} q {_name(q_dtype)} cache {_name(cache_dtype)} "
                       "partial",
                       lambda q=q, kv=kv, cos=cos, kc=kc, vc=vc, s=slots:
                       ops.rotary_write_kv(q, kv, kv, cos, cos, kc, vc, s))


def _matmul_cases(ops) -> Iterator[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """Both models' shapes at every level: they share their variants (the kernel does not
    specialize on M, and every N and K here is a multiple of 16), so the second costs no
    compile."""
    for model, (hidden, qkv, inter, qkv_bias) in MATMUL_SHAPES.items():
        for dtype in QUERY_DTYPES:
            for proj, k, n, has_bias in (("qkv", hidden, qkv, qkv_bias),
                                         ("o", hidden, hidden, False),
                                         ("gate_up", hidden, 2 * inter, False),
                                         ("down", inter, hidden, False)):
                # empty, not zeros: never run, so never touched (gate_up is 0.5 GB in fp32).
                w = torch.empty(n, k, dtype=dtype)
                b = torch.empty(n, dtype=dtype) if has_bias else None
                for rows in MATMUL_ROWS:
                    x = torch.empty(rows, k, dtype=dtype)
                    yield (f"fixed_order_matmul {model} {proj} {_name(dtype)} {rows} rows",
                           lambda x=x, w=w, b=b: ops.fixed_order_matmul(x, w, b))


def _moe_cases(ops, smoke: bool) -> Iterator[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """moe_experts (the sort, both grouped GEMMs) at each MOE_SHAPES layer in each of its
    weights' forms, decode and prefill tiles, fp16/bf16 (and float32 with dense weights: a
    float32 model is a correctness reference); smoke: gpt-oss's bf16 MXFP4 decode (the
    sort, and the dequantizing GEMMs: the dense ones are plain tiled matmuls)."""
    from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights
    from officellm.kernels.triton.fused_moe import MXFP4

    for model, (e, k, hidden, inter, act, bias, forms) in MOE_SHAPES.items():
        for dtype in (torch.bfloat16,) if smoke else QUERY_DTYPES:
            for form in forms:
                if (smoke and form != "mxfp4") or (dtype == torch.float32 and form != "dense"):
                    continue
                if form == "dense":  # empty, never touched: never run
                    w13 = torch.empty(e, 2 * inter, hidden, dtype=dtype)
                    w2 = torch.empty(e, hidden, inter, dtype=dtype)
                    code = None
                else:
                    w13 = torch.empty(e, 2 * inter, hidden // 32 * 17, dtype=torch.uint8)
                    w2 = torch.empty(e, hidden, inter // 32 * 17, dtype=torch.uint8)
                    code = MXFP4
                experts = ExpertWeights(w13, w2, code, code,
                                        torch.empty(e, 2 * inter) if bias else None,
                                        torch.empty(e, hidden) if bias else None)
                for tokens in MOE_TOKENS[:1] if smoke else MOE_TOKENS:
                    x = torch.empty(tokens, hidden, dtype=dtype)
                    weights = torch.empty(tokens, k)
                    ids = torch.zeros(tokens, k, dtype=torch.long)
                    yield (f"moe_experts {model} {form} {act}{' bias' if bias else ''} "
                           f"{_name(dtype)} {tokens} tokens",
                           lambda x=x, w=weights, i=ids, ex=experts, a=ExpertActivation(act):
                           ops.moe_experts(x, w, i, ex, a))


def _attention_cases(ops, layout: str, hq: int, hk: int, d: int, q_dtype: torch.dtype,  # type: ignore[no-untyped-def]
                     cache_dtype: torch.dtype, splits: tuple[int, ...],
                     prefill: tuple[int, ...], window: int = 0,
                     sinks: torch.Tensor | None = None) -> Iterator[tuple[str, object]]:
    tag = f"{layout} q {_name(q_dtype)} cache {_name(cache_dtype)}"
    tag += f" window {window}" if window else ""
    tag += " sinks" if sinks is not None else ""
    kc, vc = _cache(64, hk, d, cache_dtype), _cache(64, hk, d, cache_dtype)
    tables = torch.zeros(4, 64, dtype=torch.int32)
    lens = torch.full((4,), 100, dtype=torch.int32)
    q1 = torch.zeros(4, hq, d, dtype=q_dtype)
    for n in splits:
        yield (f"decode {tag} splits {n}",
               lambda n=n: ops.paged_decode_attention(q1, kc, vc, tables, lens, 0.1,
                                                      num_splits=n, window=window, sinks=sinks))
    for tokens in prefill:
        qp = torch.zeros(tokens, hq, d, dtype=q_dtype)
        starts = torch.tensor([0, tokens], dtype=torch.int32)
        yield (f"prefill {tag} {tokens} tokens",
               lambda qp=qp, s=starts, n=tokens:
               ops.paged_prefill_attention(qp, kc, vc, tables[:1], torch.tensor([n]), s, 0.1,
                                           max_query_len=n, window=window, sinks=sinks))


def _ptxas_report(ptx: str, arch: str) -> tuple[int, int]:
    """(registers, spill bytes) of the PTX's kernel, from Triton's own ptxas with -v."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([knobs.nvidia.ptxas.path, "-v", f"-arch={arch}", src,
                              "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    registers = max((int(r) for r in re.findall(r"Used (\d+) registers", text)), default=0)
    spills = sum(int(a) + int(b) for a, b in
                 re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text))
    return registers, spills


def compile_variants(arch: int, level: str = "standard", only: str = "") -> list[Variant]:
    """Compile the variants of `level` (LEVELS) for compute capability `arch` (80, 89, 90),
    those whose case names contain `only` if given; a variant that does not compile is
    reported with its error, not raised."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: kernels decorated for the interpreter "
                           "cannot be compiled; run this in a process of its own without it")
    variants: list[Variant] = []
    seen: set[tuple[str, str]] = set()
    with _compiling_for(arch) as compiled:
        for case, call in _cases(level, arch):
            if only not in case:
                continue
            before = len(compiled)
            try:
                call()  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 - reported per variant, the rest go on
                variants.append(Variant(case, "?", arch, 0, 0, 0,
                                        f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
                continue
            for name, kernel in compiled[before:]:
                ptx = kernel.asm["ptx"]  # type: ignore[attr-defined]
                if (name, ptx) in seen:
                    continue
                seen.add((name, ptx))
                target = re.search(r"\.target (sm_\w+)", ptx)
                registers, spills = _ptxas_report(ptx, target.group(1) if target else f"sm_{arch}")
                variants.append(Variant(case, name, arch,
                                        int(kernel.metadata.shared),  # type: ignore[attr-defined]
                                        registers, spills))
    return variants


def problems(variants: list[Variant]) -> list[str]:
    """What fails the check: a variant that did not compile, needs more shared memory than
    its architecture has, or spills registers with 16-bit queries (the serving dtypes)."""
    found = []
    for v in variants:
        if v.error:
            found.append(f"sm_{v.arch} {v.case}: {v.error}")
        elif v.shared > MAX_SHARED[v.arch]:
            found.append(f"sm_{v.arch} {v.case} {v.kernel}: {v.shared} B of shared memory, "
                         f"over {MAX_SHARED[v.arch]}")
        elif v.spill_bytes and "float16" in v.case.split(" cache")[0]:  # bf16 or fp16 queries
            found.append(f"sm_{v.arch} {v.case} {v.kernel}: spills {v.spill_bytes} B")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="80,89,90", help="compute capabilities, e.g. 80,89,90")
    parser.add_argument("--level", choices=LEVELS, default="standard",
                        help="how much of the variant matrix (see LEVELS)")
    parser.add_argument("--only", default="",
                        help="only the cases whose names contain this, e.g. fixed_order_matmul")
    args = parser.parse_args(argv)
    variants = [v for arch in args.arch.split(",")
                for v in compile_variants(int(arch), level=args.level, only=args.only)]
    json.dump({"variants": [asdict(v) for v in variants], "problems": problems(variants)},
              sys.stdout, indent=1)
    print()
    return 1 if problems(variants) else 0


if __name__ == "__main__":
    sys.exit(main())

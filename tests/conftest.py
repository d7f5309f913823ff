"""Shared fixtures: the bundled SmolLM2, tiny random-weight models, and a KV-leak check."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.loadgen.local_postgres import PostgresServer
from officellm.loadgen.local_postgres import missing as postgres_missing


def _cpu_has_avx2_without_avx512() -> bool:
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx2" in flags and "avx512f" not in flags


os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist the workers share the cores: each worker's in-process engines get their
# share (OpenMP threads of two workers spinning on the same two cores ran each step several
# times slower than one thread each).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

# Under Triton's interpreter tl.dot is numpy's matmul, and numpy's OpenBLAS picks its AVX2+FMA
# sgemm kernel (Haswell's, also Zen's) on a CPU without AVX-512: that kernel rounds a row
# differently with its position in the tile, so the batch-invariant kernels' bit-identity
# tests failed there under the interpreter alone (a GPU's tl.dot keeps a row's result
# whatever its neighbours, and so did OpenBLAS on the AVX-512 machines CI ran on). Its AVX
# kernel (measured row-invariant) is picked instead; OpenBLAS reads this when numpy loads,
# which nothing has done by now.
if _cpu_has_avx2_without_avx512():
    os.environ.setdefault("OPENBLAS_CORETYPE", "SandyBridge")

_LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()
_engines_made = 0  # how many engines this process has made, for no_leaked_kv_blocks


def _track_engines() -> None:
    from officellm.engine.llm_engine import LLMEngine

    if getattr(LLMEngine, "_tracked_by_tests", False):
        return
    original = LLMEngine.__init__

    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        global _engines_made
        original(self, *args, **kwargs)
        _LIVE_ENGINES.add(self)
        _engines_made += 1

    LLMEngine.__init__ = init  # type: ignore[method-assign]
    LLMEngine._tracked_by_tests = True  # type: ignore[attr-defined]


_track_engines()


# Each worker may hold a few float32 engines and a transformers model (2-3 GiB): more
# workers than this would trade memory for little.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


# The files that took longest on two cores (setup + tests, seconds, from `pytest
# --durations=0`, 2026-12-05), handed to the xdist workers first; every other file follows in
# collection order. xdist's own order (most tests first, --no-loadscope-reorder in pyproject
# turns it off) left the long one- and two-test files (a crash-and-restart, a flood) for last,
# and one worker ran them for minutes while the other sat idle. Longest first, the last files
# handed out are short and the two finish together. A stale entry costs nothing but order.
LONGEST_FILES = (
    # Builds the forced-AVX2 CPU kernels (~150 s on a fresh machine, 2026-12-06): first, so
    # the files that need that build find it done.
    "tests/engine/test_packed_linear.py",
    "tests/engine/test_speculative_decoding.py",  # 231 s before its slow tier, 2026-12-06
    "tests/engine/test_batch_invariance.py",  # 150
    "tests/kernels/test_engine_triton_path.py",  # 109
    "tests/engine/test_kv_cache_dtype.py",  # 102 s
    "tests/engine/test_tensor_parallel.py",  # 85
    "tests/engine/test_parity_smollm2.py",  # 83
    "tests/server/test_fair_sharing.py",  # 81
    "tests/engine/test_structured_output.py",  # 81
    "tests/admin_ui/test_acceptance.py",  # 72
    "tests/engine/test_sampling.py",  # 69
    "tests/server/test_responses_api.py",  # 68
    "tests/server/test_tool_calls.py",  # 65
    "tests/server/test_openai_api.py",  # 63
    "tests/loadgen/test_bench_live.py",  # 63
    "tests/kernels/test_attention_backends.py",  # 59
    "tests/server/test_structured_outputs.py",  # 54
    "tests/engine/test_prefill_pacing.py",  # 51
    "tests/engine/test_weight_quantization.py",  # 42
    "tests/engine/test_tensor_parallel_workers.py",  # 41
    "tests/server/test_shutdown.py",  # 40
    "tests/reliability/test_bad_input.py",  # 39
    "tests/server/test_failed_start.py",  # 36
    "tests/engine/test_fair_scheduling_outputs.py",  # 32
    "tests/policy/test_crash_recovery.py",  # 29 (76 in a slow run)
    "tests/policy/test_front_end_people.py",  # 29
    "tests/server/test_kv_cache_dtype_server.py",  # 26
    "tests/engine/test_startup_and_plan.py",  # 25
    "tests/admin_ui/test_local_server.py",  # 23
    "tests/policy/test_live_policy.py",  # 22
    "tests/kernels/test_extension_cache.py",  # 22
    "tests/engine/test_prefix_cache.py",  # 21
    "tests/server/test_concurrency.py",  # 21
    "tests/kernels/test_triton_compiles.py",  # 11 (39 with a cold Triton cache)
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FILES), each file's tests kept together and in order."""
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def _holds_anything(engine) -> bool:  # type: ignore[no-untyped-def]
    core = engine.engine_core
    pool = core.kv.pool
    return (bool(core.scheduler.requests) or pool.num_free_blocks != pool.num_blocks
            or any(b.ref_count for b in pool.blocks))


_engines_made_at_last_collection = 0


@pytest.fixture(autouse=True)
def no_leaked_kv_blocks():
    """After every test, every engine in this process holds no request and no block."""
    global _engines_made_at_last_collection
    yield
    # A full collection of a process holding torch and transformers takes ~0.5 s: it runs
    # only after a test that made an engine (engines sit in reference cycles: their weights
    # would otherwise wait for Python's next full collection) or when an engine holds
    # something (one that only garbage refers to is not a leak), not after all ~1,300 tests
    # that run once a session's engine exists.
    if (_engines_made == _engines_made_at_last_collection
            and not any(_holds_anything(engine) for engine in list(_LIVE_ENGINES))):
        return
    gc.collect()
    _engines_made_at_last_collection = _engines_made
    for engine in list(_LIVE_ENGINES):
        core = engine.engine_core
        leftover = list(core.scheduler.requests)
        # Clean up before failing, so one leak does not cascade into later tests.
        core.abort_requests(leftover)
        pool = core.kv.pool
        assert not leftover, f"requests left in the engine: {leftover}"
        assert pool.num_free_blocks == pool.num_blocks, (
            f"{pool.num_blocks - pool.num_free_blocks} KV blocks leaked")
        assert all(b.ref_count == 0 for b in pool.blocks)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (loadgen/local_postgres.py); `.url()` makes a
    fresh database. Skipped, saying why, where PostgreSQL or psycopg is missing."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct as the engine serves it: the GGUF's description in
    the cache (config, tokenizer), its weights read from the file."""
    from officellm.engine.loading.model_loader import resolve_model_dir

    return resolve_model_dir(None)


@pytest.fixture(scope="session")
def smollm2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled GGUF as a whole float32 Hugging Face checkpoint, for transformers (the
    model as written); written once per run and shared by pytest-xdist's workers."""
    from filelock import FileLock

    from officellm.engine.loading.gguf_checkpoint import write_hf_checkpoint
    from officellm.engine.loading.model_loader import bundled_model_path

    root = (tmp_path_factory.getbasetemp().parent if "PYTEST_XDIST_WORKER" in os.environ
            else tmp_path_factory.getbasetemp())
    target = root / "smollm2-checkpoint"
    with FileLock(f"{target}.lock"):
        if not (target / "model.safetensors.index.json").is_file():
            partial = root / f"smollm2-checkpoint.partial{os.getpid()}"
            partial.mkdir(parents=True, exist_ok=True)
            write_hf_checkpoint(bundled_model_path(), partial)
            partial.rename(target)
    return target


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path):
    """The bundled SmolLM2 tokenizer (the real chat template the engine uses)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))

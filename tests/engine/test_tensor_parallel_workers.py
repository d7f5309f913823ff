"""Tensor-parallel worker processes never outlive their engine: not after close(), not
when the engine's process is killed or terminated, and a dead worker fails the step that
needed it instead of hanging the engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from officellm.engine import SamplingParams
from officellm.engine.worker.multiproc_executor import WorkerDiedError
from tests.engine.conftest import make_llm
from tests.support.processes import gone, wait_gone
from tests.support.tiny_models import shared_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_dir) -> Path:
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


def spawned_children() -> list[psutil.Process]:
    """Live processes this one started with multiprocessing's spawn (not its resource
    tracker, which multiprocessing keeps for the whole session)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if not gone(child.pid) and "spawn_main" in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def test_an_impossible_split_is_refused_before_any_worker_starts(tiny_dir):
    from officellm.engine.models.shard_plan import TensorParallelSplitError

    before = {c.pid for c in spawned_children()}
    with pytest.raises(TensorParallelSplitError, match="across 3 ranks"):
        make_llm(tiny_dir, tensor_parallel_size=3)  # 8 heads over 2 KV heads
    assert {c.pid for c in spawned_children()} == before


def test_a_start_up_error_leaves_no_worker(tiny_dir):
    from officellm.engine.kv_plan import KVCacheTooSmallError

    before = {c.pid for c in spawned_children()}
    with pytest.raises(KVCacheTooSmallError, match="max_model_len=1,024"):
        make_llm(tiny_dir, kv_cache_memory="64KiB", max_model_len=1024, tensor_parallel_size=2)
    assert wait_gone([c.pid for c in spawned_children() if c.pid not in before])


def test_close_stops_every_worker(tiny_dir):
    llm = make_llm(tiny_dir, kv_cache_memory="4MiB", tensor_parallel_size=2)
    pids = llm.llm_engine.engine_core.executor.worker_pids
    assert len(pids) == 1 and not gone(pids[0])
    llm.close()
    assert all(gone(p) for p in pids)
    llm.close()  # idempotent


# The engine in its own process: print the worker pids, then wait to be killed.
ENGINE_SCRIPT = textwrap.dedent("""
    import sys
    from officellm.engine import LLM

    if __name__ == "__main__":
        llm = LLM(sys.argv[1], dtype="float32", kv_cache_dtype="float32", kv_cache_memory="4MiB",
                  tensor_parallel_size=2)
        print(*llm.llm_engine.engine_core.executor.worker_pids, flush=True)
        sys.stdin.read()
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_exit_when_the_engine_process_dies(tiny_dir, tmp_path, sig):
    script = tmp_path / "engine_process.py"
    script.write_text(ENGINE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_dir)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 1 and not gone(pids[0])
        proc.send_signal(sig)
        proc.wait(30)
        assert wait_gone(pids, timeout=10), f"worker {pids} outlived its engine"
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_worker_fails_the_batch_and_stops_the_engine(tiny_dir):
    with make_llm(tiny_dir, kv_cache_memory="4MiB", tensor_parallel_size=2) as llm:
        engine = llm.llm_engine
        pid = engine.engine_core.executor.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        assert wait_gone([pid])
        engine.add_request("r", [10, 11, 12], SamplingParams(temperature=0, max_tokens=4))
        with pytest.raises(WorkerDiedError, match="officellm-tp-rank1 exited"):
            engine.step()
        assert not engine.has_unfinished_requests()  # the batch's request failed, freed

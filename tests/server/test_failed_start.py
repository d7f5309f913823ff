"""A start that fails, fails: when the model does not load, `officellm serve` exits 1 within
seconds, its last line of output the one-sentence reason (after uvicorn's shutdown lines and
every log line), so a service manager and the console see a failed start. In-process the app
says "loading" only until the load ends, then the failure; the library never exits."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.cli.serve import EXIT_LOAD_FAILED
from officellm.engine import EngineState, LoadFailure
from officellm.engine.kv_plan import KVCacheTooSmallError
from tests.server.failing_serve import BUG_MESSAGE
from tests.support.server_process import ServerProcess

# Loading on a fresh, slow 2-core box dequantizes the GGUF and builds the CPU kernels first;
# that is not what is measured. What is: the exit follows the failure within seconds.
LOAD_TIMEOUT_S = 180.0
EXIT_AFTER_FAILURE_S = 20.0
FAILURE_LOGGED = "Loading the engine failed"


@pytest.fixture
def failing() -> Iterator[list[ServerProcess]]:
    """Servers started by a test, stopped (if still running) and cleaned up after it."""
    servers: list[ServerProcess] = []
    yield servers
    for srv in servers:
        srv.stop()


def _failed_start(servers: list[ServerProcess], *flags: str, logged: str = FAILURE_LOGGED,
                  **kwargs) -> tuple[int, str, float]:
    """Start a server that must not start; (exit status, its whole output, seconds from the
    failure being logged to the exit)."""
    srv = ServerProcess(*flags, **kwargs)
    servers.append(srv)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while logged not in srv.output() and srv.proc.poll() is None:
        if time.monotonic() > deadline:
            pytest.fail(f"no load failure within {LOAD_TIMEOUT_S:.0f} s:\n{srv.output()}")
        time.sleep(0.1)
    logged = time.monotonic()
    try:
        code = srv.proc.wait(EXIT_AFTER_FAILURE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_AFTER_FAILURE_S:.0f} s after the load failed "
                    f"(it must exit, not serve 503s):\n{srv.output()}")
    return code, srv.output(), time.monotonic() - logged


def _last_line(output: str) -> str:
    lines = output.rstrip("\n").splitlines()
    return lines[-1] if lines else ""


def _assert_orderly(output: str, last: str) -> None:
    """uvicorn shut down (and the app's lifespan with it) before the reason was printed."""
    assert output.index("Application shutdown complete") < output.rindex(last)
    assert "Server stopped: the model did not load" in output


@pytest.mark.slow  # CI budget: docs/testing.md
def test_an_embedding_model_that_does_not_load_stops_the_server_with_its_reason(
        failing, tmp_path) -> None:
    nowhere = tmp_path / "nowhere"
    code, output, _ = _failed_start(failing, "--embedding-model", str(nowhere),
                                    logged="Loading the embedding model failed")
    assert code == EXIT_LOAD_FAILED, output
    last = _last_line(output)
    assert last.startswith(f"Embedding model {nowhere} not found: give a sentence-transformers")
    _assert_orderly(output, last)


def test_kv_pool_too_small_exits_with_the_refusal_as_last_line(failing) -> None:
    # SmolLM2-135M in float32 is 46,080 B/token: 16 MiB holds 22 blocks of 16 = 352 tokens.
    code, output, seconds = _failed_start(failing, "--kv-cache-memory", "16MiB",
                                          "--max-model-len", "8192")
    assert code == EXIT_LOAD_FAILED == 1, output
    last = _last_line(output)
    assert last.startswith("One request of max_model_len=8,192 tokens needs 0.35 GiB"), output
    assert "the largest max_model_len that fits is 352." in last
    assert f"ERROR officellm.async_engine: {FAILURE_LOGGED}: {last}" in output
    assert "Traceback" not in output  # a refusal is a sentence, not a stack
    _assert_orderly(output, last)
    assert seconds < EXIT_AFTER_FAILURE_S


def test_missing_model_exits_with_a_sentence_naming_the_path(failing, tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    code, output, _ = _failed_start(failing, str(missing))
    assert code == 1, output
    last = _last_line(output)
    assert str(missing) in last and "not found" in last, output
    assert "Traceback" not in output
    _assert_orderly(output, last)


def test_unexpected_load_error_logs_the_traceback_and_ends_with_one_line(failing) -> None:
    code, output, _ = _failed_start(failing, module="tests.server.failing_serve",
                                    env={"FAILING_SERVE_FAULT": "bug"})
    assert code == 1, output
    last = _last_line(output)
    assert last == f"Loading the model failed: RuntimeError: {BUG_MESSAGE}", output
    assert output.index("Traceback") < output.rindex(last)
    _assert_orderly(output, last)


@pytest.mark.slow  # CI budget: docs/testing.md
def test_tensor_parallel_worker_that_cannot_start_fails_the_start(failing) -> None:
    code, output, _ = _failed_start(failing, "--tensor-parallel-size", "2",
                                    module="tests.server.failing_serve",
                                    env={"FAILING_SERVE_FAULT": "tp-worker"})
    assert code == 1, output
    last = _last_line(output)
    assert last.startswith("Tensor-parallel worker failed to start: officellm-tp-rank1 exited "
                           "with code 1"), output
    _assert_orderly(output, last)


def test_in_process_health_says_loading_until_the_load_fails_then_the_failure(tmp_path) -> None:
    """`create_app` without uvicorn: the callback is told, the app answers why, nobody exits."""
    gate = threading.Event()
    refusal = "One request of max_model_len=8,192 tokens needs more than there is."

    def factory():
        gate.wait(60)
        raise KVCacheTooSmallError(refusal)

    told: list[LoadFailure] = []
    app = create_app(ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                                    admin_remote=True), factory)  # TestClient is no loopback
    admin = {"Authorization": f"Bearer {(tmp_path / 'admin_token').read_text().strip()}"}
    engine = app.state.server.default_model.async_engine
    engine.on_load_failure = told.append
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503 and "still loading" in r.json()["error"]["message"]
        gate.set()
        assert not engine.wait_ready(30) and engine.state is EngineState.DEAD
        for path, body in [("/health", None), ("/v1/completions", {"prompt": "x"}),
                           ("/admin/plan", None)]:
            r = client.request("GET" if body is None else "POST", path, json=body, headers=admin)
            message = r.json()["error"]["message"]
            assert r.status_code == 503 and r.headers["retry-after"], r.text
            assert message == f"The engine failed: {refusal}" and "loading" not in message
    assert [f.reason for f in told] == [refusal]
    assert isinstance(told[0].exception, KVCacheTooSmallError)


def test_load_failure_reason_is_one_line() -> None:
    assert LoadFailure.of(FileNotFoundError("No model\n  at /x.")).reason == "No model at /x."
    assert LoadFailure.of(KeyError("w")).reason == "Loading the model failed: KeyError: 'w'"
    assert LoadFailure.of(MemoryError()).reason == "Loading the model failed: MemoryError"

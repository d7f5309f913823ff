"""One real server shared by the server tests (loading the model is the slow part)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.server_process import TEST_THREADS, ServerProcess

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """`officellm serve` on a free port with an API key, ready to answer."""
    srv = ServerProcess()
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def reference_llm():
    """The offline engine, same dtype and pool: greedy replies must match the server's."""
    from engine import LLM

    return LLM(dtype="float32", kv_cache_memory="256MiB", num_threads=int(TEST_THREADS))

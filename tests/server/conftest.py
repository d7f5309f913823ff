"""One real server shared by the server tests (loading the model is the slow part)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import openai
import pytest

from tests.support.server_api import TIMEOUT
from tests.support.server_process import TEST_THREADS, ServerProcess

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The shared server's --default-max-tokens: short, as a CI box decodes slowly.
DEFAULT_MAX_TOKENS = 40


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """`officellm serve` on a free port with an API key, ready to answer; Claude Code's model
    names (claude-*) are served by the model, as docs/clients.md tells the admin to set up; a
    request without max_tokens gets DEFAULT_MAX_TOKENS."""
    srv = ServerProcess("--model-alias", "claude-*",
                        "--default-max-tokens", str(DEFAULT_MAX_TOKENS))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    """The real `openai` client, pointed at the shared server with its key."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                         timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="session")
def model(client: openai.OpenAI) -> str:
    """The served model's name, as /v1/models reports it."""
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def reference_llm():
    """The offline engine, same dtype and pool: greedy replies must match the server's."""
    from officellm.engine import LLM

    return LLM(dtype="float32", quantization="none", kv_cache_dtype="float32",
               kv_cache_memory="256MiB",
               num_threads=int(TEST_THREADS))

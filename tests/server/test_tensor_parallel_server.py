"""`officellm serve --tensor-parallel-size 2` on the CPU: the real `openai` client gets the
one-process engine's greedy reply, and SIGTERM stops the worker process with the server."""

from __future__ import annotations

import re

import openai
import pytest

from officellm.engine import SamplingParams
from tests.support.processes import wait_gone
from tests.support.server_process import ServerProcess

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tp_server():
    srv = ServerProcess("--tensor-parallel-size", "2")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.mark.slow  # CI budget: docs/testing.md
def test_tensor_parallel_server_answers_the_openai_client(tp_server, reference_llm) -> None:
    client = openai.OpenAI(base_url=f"{tp_server.base_url}/v1", api_key=tp_server.api_key,
                           timeout=120.0, max_retries=0)
    ref = reference_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24))[0]
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == ref.outputs[0].text
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_sigterm_stops_the_worker_processes_with_the_server(tp_server) -> None:
    found = re.search(r"Started 1 tensor-parallel worker process\(es\): pids (\d+)",
                      tp_server.output())
    assert found, tp_server.output()
    tp_server.terminate()
    tp_server.proc.wait(60)
    assert "KV cache pool per rank: the minimum over 2 ranks" in tp_server.output()
    assert wait_gone([int(found.group(1))], timeout=10)

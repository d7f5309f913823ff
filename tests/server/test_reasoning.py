"""A reasoning parser on a real server moves the thinking out of the answer. The bundled
SmolLM2 never writes `</think>`, so under `deepseek_r1` (whose template opens `<think>` in
the prompt) its whole output is unfinished thinking: all reasoning, no content. The parsers'
own behaviour on recorded Qwen3 and DeepSeek-R1 outputs is tests/openai_parsers'."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.server_api import CHAT, TIMEOUT
from tests.support.server_process import BASE_FLAGS, ServerProcess


@pytest.fixture(scope="module")
def thinking(server) -> Iterator[openai.OpenAI]:
    srv = ServerProcess(*BASE_FLAGS, "--reasoning-parser", "deepseek_r1")
    try:
        srv.wait_ready()
        yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=srv.api_key,
                            timeout=TIMEOUT, max_retries=0)
    finally:
        srv.stop()


def _plain(client: openai.OpenAI, model: str) -> str:
    out = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=24)
    return out.choices[0].message.content


def test_thinking_goes_to_reasoning_content_not_the_answer(thinking, client, model) -> None:
    message = thinking.chat.completions.create(model=model, messages=CHAT, temperature=0,
                                               max_tokens=24).choices[0].message
    assert message.content is None
    # The same greedy text a server without the parser answers, under vLLM's two names.
    assert message.reasoning_content == _plain(client, model)
    assert message.model_extra["reasoning"] == message.reasoning_content


def test_streamed_thinking_arrives_as_reasoning_deltas(thinking, client, model) -> None:
    reasoning, content = "", ""
    for chunk in thinking.chat.completions.create(model=model, messages=CHAT, temperature=0,
                                                  max_tokens=24, stream=True):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (_plain(client, model), "")

"""A reasoning parser on a real server moves the thinking out of the answer. The bundled
SmolLM2 never writes `</think>`, so under `deepseek_r1` (whose template opens `<think>` in
the prompt) its whole output is unfinished thinking: all reasoning, no content. The parsers'
own behaviour on recorded Qwen3 and DeepSeek-R1 outputs is tests/openai_parsers'."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.support.server_api import CHAT, TIMEOUT
from tests.support.server_process import BASE_FLAGS, ServerProcess


@pytest.fixture(scope="module")
def thinking_server(server) -> Iterator[ServerProcess]:
    srv = ServerProcess(*BASE_FLAGS, "--reasoning-parser", "deepseek_r1")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def thinking(thinking_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{thinking_server.base_url}/v1",
                         api_key=thinking_server.api_key, timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def thinking_claude(thinking_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=thinking_server.base_url,
                               api_key=thinking_server.api_key, timeout=TIMEOUT, max_retries=0)


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


def _anthropic(claude: anthropic.Anthropic, model: str, display: str | None = None):
    thinking = {"type": "adaptive", **({"display": display} if display else {})}
    # Greedy in the body: the anthropic client (2.x) has no sampling arguments.
    return claude.messages.create(model=model, max_tokens=24, extra_body={"temperature": 0},
                                  messages=[{"role": "user", "content": CHAT[0]["content"]}],
                                  thinking=thinking)


def test_anthropic_thinking_is_a_thinking_block(thinking_claude, client, model) -> None:
    message = _anthropic(thinking_claude, model)
    assert [b.type for b in message.content] == ["thinking"]
    assert message.content[0].thinking == _plain(client, model)


def test_anthropic_streamed_thinking_assembles_to_the_whole(thinking_claude, model) -> None:
    whole = _anthropic(thinking_claude, model)
    with thinking_claude.messages.stream(model=model, max_tokens=24,
                                         extra_body={"temperature": 0},
                                         messages=[{"role": "user",
                                                    "content": CHAT[0]["content"]}],
                                         thinking={"type": "adaptive"}) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert "thinking" in kinds  # the SDK's event for a thinking_delta
    assert streamed.content[0].thinking == whole.content[0].thinking


def test_anthropic_thinking_shown_omitted_keeps_the_block_without_its_text(thinking_claude,
                                                                          model) -> None:
    message = _anthropic(thinking_claude, model, display="omitted")
    assert [(b.type, b.thinking) for b in message.content] == [("thinking", "")]

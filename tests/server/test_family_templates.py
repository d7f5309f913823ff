"""A model with Gemma 3's chat template (tests/support/chat_templates/gemma3.jinja: no system
role, strict user/assistant turns, no tools) through the real server and the real `openai`
client: a system message with tools is answered, not a 500, and the prompt the engine got is
the one with the system text and the tools' description in the first user turn (its token
count is the rendering's); a follow-up with a call and its result, which the template itself
refuses, is answered too. The model is the shared tiny random Llama with SmolLM2's tokenizer:
what it writes does not matter here, only what it was given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.chat.tools import ChatTool, ToolRequest, template_message
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

GEMMA3 = Path(__file__).parents[1] / "support" / "chat_templates" / "gemma3.jinja"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "system", "content": "Answer in French."},
       {"role": "user", "content": "Weather in Paris?"}]
FOLLOW_UP = [*ASK,
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'}]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory, smollm2_dir: Path) -> Path:
    """The tiny Llama's files with Gemma 3's template in place of its own."""
    tiny = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    out = tmp_path_factory.mktemp("gemma3-template")
    for f in tiny.iterdir():
        if f.name != "chat_template.jinja":
            (out / f.name).symlink_to(f)
    (out / "chat_template.jinja").write_text(GEMMA3.read_text())
    return out


@pytest.fixture(scope="module")
def gemma(gemma_dir: Path) -> Iterator[openai.OpenAI]:
    with ServerProcess(str(gemma_dir), "--served-model-name", "gemma-tiny") as srv:
        yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=srv.api_key,
                            timeout=TIMEOUT, max_retries=0)


def _prompt_tokens(smollm2_tokenizer, messages: list[dict]) -> int:
    """The length of the prompt the chat route renders for `messages` with TOOLS."""
    template = GEMMA3.read_text()
    tools = ToolRequest.of([ChatTool.model_validate(t) for t in TOOLS], "auto", True)
    plan = ChatFormats.resolve(template, "auto", "auto", True).plan(tools, None)
    shaped = plan.messages([template_message({k: v for k, v in m.items() if v is not None})
                            for m in messages])
    text = smollm2_tokenizer.apply_chat_template(shaped, chat_template=template,
                                                 tokenize=False, add_generation_prompt=True)
    assert "Weather in a city" in text.split("<start_of_turn>user\n")[1]
    return len(smollm2_tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("messages", [ASK, FOLLOW_UP], ids=["system and tools", "follow-up"])
def test_gemma3s_template_is_served_with_the_tools_in_the_first_user_turn(
        gemma, smollm2_tokenizer, messages) -> None:
    r = gemma.chat.completions.create(model="gemma-tiny", messages=messages, tools=TOOLS,
                                      temperature=0, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens == _prompt_tokens(smollm2_tokenizer, messages), json.dumps(
        messages)

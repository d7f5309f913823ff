"""Acceptance 2 and 3: many streaming clients at once; a client that leaves mid-stream."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai

from officellm.engine import SamplingParams
from tests.support.server_api import TIMEOUT, sample, scrape
from tests.support.server_process import ServerProcess

NUM_CLIENTS = 16
MAX_TOKENS = 8


def _chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write the number {i * 7 + 3} in words."}]


def test_16_concurrent_streams(server: ServerProcess, reference_llm) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                                timeout=TIMEOUT, max_retries=0)
    model = reference_llm.llm_engine.model_name

    async def one(i: int) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model=model, messages=_chat(i), temperature=0, max_tokens=MAX_TOKENS, stream=True,
            stream_options={"include_usage": True})
        text, finish, tokens = "", None, -1
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return text, finish, tokens

    async def all_of_them() -> list[tuple[str, str | None, int]]:
        try:
            return await asyncio.gather(*(one(i) for i in range(NUM_CLIENTS)))
        finally:
            await client.close()

    results = asyncio.run(all_of_them())
    refs = reference_llm.chat([_chat(i) for i in range(NUM_CLIENTS)],
                              SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    texts = [r[0] for r in results]
    assert len(set(texts)) == NUM_CLIENTS, texts  # distinct prompts, distinct answers
    for (text, finish, tokens), ref in zip(results, refs, strict=True):
        assert text == ref.outputs[0].text
        assert finish == ref.outputs[0].finish_reason
        assert tokens == len(ref.outputs[0].token_ids)


def test_disconnect_mid_stream_frees_everything(server: ServerProcess) -> None:
    name = {"model_name": "SmolLM2-135M-Instruct.Q4_1"}
    body = {"messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      headers=server.headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        contents = 0
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                contents += 1
                if contents == 3:
                    break
        busy = scrape(server)
        assert sample(busy, "vllm:num_requests_running", **name) == 1
        assert sample(busy, "vllm:kv_cache_usage_perc", **name) > 0
    left = time.monotonic()  # the connection is closed here
    while True:
        now = scrape(server)
        if (sample(now, "vllm:num_requests_running", **name) == 0
                and sample(now, "vllm:kv_cache_usage_perc", **name) == 0):
            break
        assert time.monotonic() - left < 1.0, "request still running 1 s after the client left"
        time.sleep(0.05)
    assert sample(now, "vllm:num_requests_waiting", **name) == 0
    assert sample(now, "vllm:generation_tokens_total", **name) < \
        sample(busy, "vllm:generation_tokens_total", **name) + 100  # it really stopped
    assert sample(now, "officellm:requests_in_flight") == 0


def test_disconnect_non_stream_aborts(server: ServerProcess) -> None:
    name = {"model_name": "SmolLM2-135M-Instruct.Q4_1"}
    body = {"messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
    client = httpx.Client(headers=server.headers)
    try:
        client.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=1.5)
        raise AssertionError("a 2000-token answer cannot arrive in 1.5 s here")
    except httpx.ReadTimeout:
        client.close()  # drops the connection, as a client that gave up does
    left = time.monotonic()
    while True:
        now = scrape(server)
        if sample(now, "vllm:num_requests_running", **name) == 0 and \
                sample(now, "vllm:kv_cache_usage_perc", **name) == 0:
            break
        assert time.monotonic() - left < 1.0, "request still running 1 s after the client left"
        time.sleep(0.05)

"""A server started with a one-byte --kv-cache-dtype answers chats over that cache, and its
start-up lines and /admin/plan (the console's Capacity tab) count that cache's bytes."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.server_process import ServerProcess


# SmolLM2: 2 x 30 layers x 3 KV heads x 64 values x 1 B (+ int8's 4-byte scale per row).
@pytest.mark.parametrize(("kv_dtype", "bytes_per_token"), [("fp8_e4m3", 11_520),
                                                           pytest.param("int8", 12_240,
                                                                        marks=pytest.mark.slow)])
def test_a_one_byte_cache_server_chats_and_plans_with_its_bytes(kv_dtype, bytes_per_token):
    with ServerProcess("--kv-cache-dtype", kv_dtype) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=srv.api_key,
                               max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8, temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        plan = httpx.get(f"{srv.base_url}/admin/plan",
                         headers={"Authorization": f"Bearer {srv.admin_token}"}).json()
        assert plan["kv_cache_dtype"] == kv_dtype
        assert plan["bytes_per_token"] == bytes_per_token
        assert f"KV cache {kv_dtype}" in srv.output()

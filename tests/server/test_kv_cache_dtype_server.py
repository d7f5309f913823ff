"""A server started with --kv-cache-dtype fp8_e4m3 answers chats over its one-byte cache,
and its start-up lines and /admin/plan (the console's Capacity tab) count that cache's bytes."""

from __future__ import annotations

import httpx
import openai

from tests.support.server_process import ServerProcess


def test_an_fp8_server_chats_and_plans_with_one_byte_per_value():
    with ServerProcess("--kv-cache-dtype", "fp8_e4m3") as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=srv.api_key,
                               max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8, temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        plan = httpx.get(f"{srv.base_url}/admin/plan",
                         headers={"Authorization": f"Bearer {srv.admin_token}"}).json()
        assert plan["kv_cache_dtype"] == "fp8_e4m3"
        assert plan["bytes_per_token"] == 11_520  # SmolLM2: 2 x 30 x 3 x 64 x 1 B
        assert "KV cache fp8_e4m3" in srv.output()

"""The KV cache's tiers through a real server. The disk tier (the office profile's default,
kv-cache/ beside the database): Claude Code's recorded request, prefilled once, is read back from disk instead of
computed after the model's idle sleep and after the server restarts, with the same answer;
the hits show in /metrics; a person's cached context is purged from the pool and the disk.
The host tier (--kv-offloading-size): a chat evicted from the pool is copied back from RAM.

A tiny random-weight model serves it (the agent's prompt is ~4k tokens with its tools), as
in test_recorded_clients.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from officellm.engine.kv_plan import ALLOW_LONG_MAX_MODEL_LEN
from tests.support.server_api import TIMEOUT, sample, scrape_idle, wait_for_state
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

RECORDED = Path(__file__).parent / "recorded" / "claude_code_2.1.197.json"
IDLE_S = 3
BLOCK = 16


@dataclass
class Answer:
    text: str
    input_tokens: int
    ttft_s: float


def ask_like_claude_code(server: ServerProcess) -> Answer:
    """The recorded request, greedy and short: its text, prompt tokens and time to the
    first text delta."""
    record = json.loads(RECORDED.read_text())
    body = {**record["body"], "max_tokens": 8, "temperature": 0}
    headers = {**record["headers"], **server.headers}
    start = time.monotonic()
    ttft = None
    text, input_tokens = [], 0
    with httpx.stream("POST", f"{server.base_url}{record['path']}", json=body, headers=headers,
                      timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "message_start":
                input_tokens = event["message"]["usage"]["input_tokens"]
            elif event["type"] == "content_block_delta":
                ttft = ttft if ttft is not None else time.monotonic() - start
                delta = event["delta"]
                text.append(delta.get("text") or delta.get("partial_json") or "")
    return Answer("".join(text), input_tokens, ttft if ttft is not None else float("nan"))


def disk_hits(server: ServerProcess) -> float:
    metrics = scrape_idle(server)
    return sum(v for (name, _), v in metrics.items()
               if name == "vllm:external_prefix_cache_hits_total")


@dataclass
class Runs:
    cold: Answer
    after_sleep: Answer
    hits_after_sleep: float
    after_restart: Answer
    hits_after_restart: float
    files_dir: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smollm2_dir) -> Iterator[Runs]:
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    files = tmp_path_factory.mktemp("kv-disk-server")
    flags = (str(model), "--max-model-len", "16384", "--max-context-tokens", "0",
             "--model-alias", "claude-*", "--sleep-idle-seconds", str(IDLE_S))
    env = {ALLOW_LONG_MAX_MODEL_LEN: "1"}
    with ServerProcess(*flags, db=files / "officellm.db", env=env) as first:
        cold = ask_like_claude_code(first)
        wait_for_state(first, "sleeping")
        after_sleep = ask_like_claude_code(first)
        hits_after_sleep = disk_hits(first)
    with ServerProcess(*flags, db=files / "officellm.db", env=env) as second:
        after_restart = ask_like_claude_code(second)
        hits_after_restart = disk_hits(second)
    print(f"Claude Code's request ({cold.input_tokens} tokens): TTFT cold {cold.ttft_s:.2f} s, "
          f"after sleep {after_sleep.ttft_s:.2f} s, after restart {after_restart.ttft_s:.2f} s")
    yield Runs(cold, after_sleep, hits_after_sleep, after_restart, hits_after_restart, files)


def test_after_an_idle_sleep_the_agents_prompt_is_read_from_disk(runs: Runs) -> None:
    assert runs.hits_after_sleep >= runs.cold.input_tokens - 2 * BLOCK


def test_after_a_restart_the_agents_prompt_is_read_from_disk(runs: Runs) -> None:
    assert runs.hits_after_restart >= runs.cold.input_tokens - 2 * BLOCK


def test_the_answer_read_from_disk_is_the_answer_computed(runs: Runs) -> None:
    assert runs.cold.text
    assert runs.after_sleep.text == runs.cold.text
    assert runs.after_restart.text == runs.cold.text


def test_the_disk_tier_lives_beside_the_database_and_holds_no_prompt_in_clear(
        runs: Runs) -> None:
    files = list((runs.files_dir / "kv-cache").rglob("*.kv"))
    assert len(files) >= runs.cold.input_tokens // BLOCK
    system = json.loads(RECORDED.read_text())["body"]["system"]
    sample_text = json.dumps(system)[40:80].encode()
    assert not any(sample_text in f.read_bytes() for f in files)


def test_purging_a_person_forgets_their_cached_context(tmp_path, tmp_path_factory,
                                                       smollm2_dir) -> None:
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    with ServerProcess(str(model), db=tmp_path / "officellm.db") as server:
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        r = httpx.post(f"{server.base_url}/admin/users", json={"name": "ann"}, headers=admin,
                       timeout=TIMEOUT)
        assert r.status_code == 201, r.text
        key = httpx.post(f"{server.base_url}/admin/keys", json={"user": "ann"},
                         headers=admin, timeout=TIMEOUT).json()["key"]
        ask = {"messages": [{"role": "user", "content": "Summarise our office rules. " * 20}],
               "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=ask,
                       headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        scrape_idle(server)
        time.sleep(0.5)  # the writer thread lands the blocks
        on_disk = list((tmp_path / "kv-cache").rglob("*.kv"))
        assert on_disk
        r = httpx.post(f"{server.base_url}/admin/users/ann/purge-cache", headers=admin,
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["pool_blocks"] >= len(on_disk)
        assert r.json()["disk_tier"] is True
        assert not list((tmp_path / "kv-cache").rglob("*.kv"))
        name = server_model(server)
        before = scrape_idle(server)
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=ask,
                       headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)
        assert r.status_code == 200
        after = scrape_idle(server)
    for counter in ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total"):
        assert sample(after, counter, model_name=name) == sample(before, counter,
                                                                 model_name=name)


def server_model(server: ServerProcess) -> str:
    r = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=TIMEOUT)
    return r.json()["data"][0]["id"]


def test_a_chat_evicted_from_a_small_pool_is_copied_back_from_ram_and_shown(
        tmp_path, tmp_path_factory, smollm2_dir) -> None:
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    block_bytes = BLOCK * 2 * 3 * 2 * 8 * 4  # the tiny llama's float32 KV
    flags = (str(model), "--kv-cache-memory", str(12 * block_bytes), "--max-model-len", "160",
             "--kv-offloading-size", f"{64 * block_bytes}B", "--kv-disk-dir", "off")

    def ask(topic: str) -> str:
        body = {"messages": [{"role": "user", "content": f"Tell me about {topic}. " * 12}],
                "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body,
                       headers=server.headers, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with ServerProcess(*flags, db=tmp_path / "officellm.db") as server:
        first = ask("the printer")
        for topic in ("the kitchen", "the parking", "the holidays"):  # evict it from the pool
            ask(topic)
        again = ask("the printer")
        metrics = scrape_idle(server)
        r = httpx.get(f"{server.base_url}/admin/stats",
                      headers={"Authorization": f"Bearer {server.admin_token}"},
                      timeout=TIMEOUT)
        name = server_model(server)
    assert again == first
    assert sample(metrics, "officellm:kv_host_blocks_read_total", model_name=name) > 0
    assert sample(metrics, "vllm:external_prefix_cache_hits_total", model_name=name) > 0
    host = r.json()["models"][0]["kv_host"]
    assert host["blocks"] > 0 and host["capacity_bytes"] == 64 * block_bytes
    assert r.json()["models"][0]["kv_disk"] is None


def _person_with_a_cached_chat(server: ServerProcess, name: str) -> dict[str, str]:
    """A new person with a key, who has sent one chat; their key's headers."""
    admin = {"Authorization": f"Bearer {server.admin_token}"}
    r = httpx.post(f"{server.base_url}/admin/users", json={"name": name}, headers=admin,
                   timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    key = httpx.post(f"{server.base_url}/admin/keys", json={"user": name}, headers=admin,
                     timeout=TIMEOUT).json()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    ask = {"messages": [{"role": "user", "content": "Summarise our office rules. " * 20}],
           "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=ask, headers=headers,
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    scrape_idle(server)
    return headers


def test_deleting_a_person_removes_their_keys_and_their_cached_context(
        tmp_path, tmp_path_factory, smollm2_dir) -> None:
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    with ServerProcess(str(model), db=tmp_path / "officellm.db") as server:
        headers = _person_with_a_cached_chat(server, "ann")
        time.sleep(0.5)  # the writer thread lands the blocks
        assert list((tmp_path / "kv-cache").rglob("*.kv"))
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        r = httpx.delete(f"{server.base_url}/admin/users/ann", headers=admin, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["pool_blocks"] > 0
        assert not list((tmp_path / "kv-cache").rglob("*.kv"))
        r = httpx.get(f"{server.base_url}/v1/models", headers=headers, timeout=TIMEOUT)
        assert r.status_code == 401
        users = httpx.get(f"{server.base_url}/admin/users", headers=admin, timeout=TIMEOUT)
        assert "ann" not in [u["name"] for u in users.json()]


def test_a_person_with_a_request_running_is_disabled_and_deleted_once_it_ends(
        tmp_path) -> None:
    # The bundled model: slow enough on a CPU that the request is still running.
    with ServerProcess(db=tmp_path / "officellm.db") as server:
        headers = _person_with_a_cached_chat(server, "ben")
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        body = {"messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                          headers=headers, timeout=TIMEOUT) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # running now
            r = httpx.delete(f"{server.base_url}/admin/users/ben", headers=admin,
                             timeout=TIMEOUT)
            assert r.status_code == 409, r.text
            assert "1 request(s) running" in r.json()["error"]["message"]
            refused = httpx.get(f"{server.base_url}/v1/models", headers=headers,
                                timeout=TIMEOUT)
            assert refused.status_code == 401  # disabled at once
        # The stream closed early: the request is aborted, and the delete goes through.
        deadline = time.monotonic() + 10
        while (r := httpx.delete(f"{server.base_url}/admin/users/ben", headers=admin,
                                 timeout=TIMEOUT)).status_code == 409:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
        assert r.status_code == 200, r.text

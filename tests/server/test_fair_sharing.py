"""Fair sharing on a real `officellm serve` (office profile: --scheduling-policy fair): one user
floods, another's request is admitted ahead of the flood's tail; the per-user numbers of
/admin/stats and /metrics move by what happened; a priority change reaches the engine with
the user's next request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.policy.helpers import Admin, Office, metric
from tests.support.server_process import SMALL_POOL_FLAGS, ServerProcess

FLOOD = 6  # requests the flooding user sends at once
REPLY = 40  # tokens per flood reply: with a ~45-token prompt, 6 blocks of 16
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def office() -> Iterator[tuple[ServerProcess, Admin]]:
    # 11 blocks of 16 tokens (8 MiB at 46,080 B/token) and two running sequences: two of the
    # flood's ~85-token requests do not fit together, so the engine preempts; the other four
    # wait.
    srv = ServerProcess(*SMALL_POOL_FLAGS, "--kv-cache-memory", "8MiB", "--max-model-len", "160",
                        "--max-num-seqs", "2", api_key=None)
    try:
        srv.wait_ready()
        yield srv, Admin(srv.base_url, srv.db_path)
    finally:
        srv.stop()


def _client(srv: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, timeout=300, max_retries=0)


def _stream(client: openai.OpenAI, prompt: str, max_tokens: int, first: dict, name: str) -> None:
    """One streamed completion; the monotonic time of its first token goes in first[name]."""
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text and name not in first:
            first[name] = time.monotonic()


def _prompt(i: int) -> str:
    # Distinct words per request: no shared prefix, so blocks held add up exactly.
    return f"Request {i}: " + " ".join(f"word{i}x{j}" for j in range(12))


def _wait_for(admin: Admin, ok, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = admin.get("/stats")
        if ok(stats):
            return stats
        time.sleep(0.05)
    raise AssertionError(f"timed out; last /admin/stats: {stats}")


def _scrape(srv: ServerProcess, key: str) -> dict:
    """/metrics, as Office.metrics reads it (that helper wants the policy tests' server)."""
    return Office(srv, admin=None).metrics(key)  # type: ignore[arg-type]


def test_a_light_user_is_admitted_ahead_of_a_floods_tail(office) -> None:
    srv, admin = office
    flood_key = admin.user_with_key("flood")
    calm_key = admin.user_with_key("calm")
    before = _scrape(srv, calm_key)
    first: dict[str, float] = {}
    flood = _client(srv, flood_key)
    threads = [threading.Thread(target=_stream, args=(flood, _prompt(i), REPLY, first, f"f{i}"))
               for i in range(FLOOD)]
    for t in threads:
        t.start()
    # The flood holds both running slots, the rest of it waits in the engine.
    stats = _wait_for(admin, lambda s: s["engine"]["num_waiting"] >= FLOOD - 2
                      and s["engine"]["num_running"] == 2)
    (row,) = [u for u in stats["users"] if u["user"] == "flood"]
    engine = stats["engine"]
    assert row["running"] == 2 and engine["scheduling_policy"] == "fair"
    assert row["kv_blocks"] == engine["num_blocks_used"]  # nobody else holds any
    assert row["kv_share"] == round(engine["num_blocks_used"] / engine["num_blocks_total"], 4)

    _stream(_client(srv, calm_key), _prompt(99), 8, first, "calm")
    for t in threads:
        t.join(timeout=300)
    assert len(first) == FLOOD + 1, first
    behind = [n for n, t in first.items() if n != "calm" and t > first["calm"]]
    # Under fcfs all four waiting flood requests start before calm's; under fair calm takes
    # the next free slot.
    assert len(behind) >= FLOOD - 3, (sorted(first, key=first.get), behind)

    after = _scrape(srv, calm_key)
    stats = admin.get("/stats")
    users = {u["user"]: u for u in stats["users"]}
    delta = (metric(after, "vllm:num_preemptions_total")
             - metric(before, "vllm:num_preemptions_total"))
    assert delta > 0, "the pool never filled: the per-user preemption counts prove little"
    per_user = {u: metric(after, "officellm:preemptions_total", user=u) for u in ("flood", "calm")}
    assert sum(per_user.values()) == delta
    assert {u: users[u]["preemptions_total"] if u in users else 0 for u in per_user} == per_user
    assert per_user["flood"] >= 1
    # Nothing runs any more: nobody holds a block.
    assert all(u["kv_blocks"] == 0 and u["running"] == 0 for u in stats["users"])
    assert metric(after, "officellm:kv_blocks_held") == 0
    queued = (metric(after, "vllm:request_queue_time_seconds_count")
              - metric(before, "vllm:request_queue_time_seconds_count"))
    assert queued == FLOOD + 1
    assert metric(after, "officellm:requests_total", user="flood") == FLOOD


def test_a_priority_change_reaches_the_engine_with_the_next_request(office) -> None:
    srv, admin = office
    key = admin.user_with_key("boss")
    uid = next(u["id"] for u in admin.get("/users") if u["name"] == "boss")
    client = _client(srv, key)

    def two_at_once(tag: int) -> None:
        first: dict[str, float] = {}
        threads = [threading.Thread(target=_stream,
                                    args=(client, _prompt(tag + i), REPLY, first, str(i)))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)

    def warnings() -> list[str]:
        return [line for line in srv.output().splitlines()
                if f"of key '{uid}' by recompute" in line]

    two_at_once(200)  # two ~85-token requests in 11 blocks: boss's newer one is preempted
    seen = len(warnings())
    assert seen > 0 and all("weight 1)" in w for w in warnings())
    admin.request("PUT", "/policies/users/boss", json={"priority": "high"})
    two_at_once(300)
    new = warnings()[seen:]
    assert new and all("weight 2)" in w for w in new)

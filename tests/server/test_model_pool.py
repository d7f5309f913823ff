"""Several models served by name (issue 40): a real server with the bundled SmolLM2 (the
command line's model, the default), two tiny random-weight models from the registry and the
bundled embedding model, under a memory budget that holds the default and one tiny model.

Requests reach the engine their `model` names; a model out of memory loads on its first
request while the others keep answering; concurrent first requests share one load; a load
that does not fit unloads the least recently used idle model, or is refused with a 503 that
names what is loaded; an idle model sleeps and wakes; a policy may restrict the models a user
may use; no engine keeps a KV block once its requests are done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from officellm.engine import BUNDLED_EMBEDDER, EngineConfig, estimate_footprint
from tests.support.server_api import TIMEOUT, sample, scrape
from tests.support.server_process import API_KEY, BASE_FLAGS, ServerProcess
from tests.support.tiny_models import shared_tiny_model

TINY_OPTIONS = {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "float32",
                "kv_cache_memory": "32MiB"}
SLEEPY_IDLE_S = 2.0
ASK = [{"role": "user", "content": "Say something."}]


class Office:
    """The server, its admin token, and the registry's models."""

    def __init__(self, server: ServerProcess, tiny_llama: Path, tiny_qwen: Path) -> None:
        self.server = server
        self.url = server.base_url
        self.admin = {"Authorization": f"Bearer {server.admin_token}"}
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0,
                                    timeout=TIMEOUT)
        self.tiny_llama, self.tiny_qwen = tiny_llama, tiny_qwen

    def register(self, name: str, source: Path, **extra: object) -> dict:
        body = {"name": name, "source": str(source), "options": dict(TINY_OPTIONS), **extra}
        r = httpx.post(f"{self.url}/admin/models", json=body, headers=self.admin,
                       timeout=TIMEOUT)
        assert r.status_code == 201, r.text
        return r.json()

    @property
    def default(self) -> str:
        """The command line's model's name."""
        return next(name for name, row in self.models().items() if row["default"])

    def models(self) -> dict[str, dict]:
        r = httpx.get(f"{self.url}/admin/models", headers=self.admin, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return {row["name"]: row for row in r.json()["models"]}

    def state(self, name: str) -> str:
        r = httpx.get(f"{self.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return next(m["state"] for m in r.json()["data"] if m["id"] == name)

    def admin_post(self, path: str) -> httpx.Response:
        return httpx.post(f"{self.url}/admin/models/{path}", headers=self.admin,
                          timeout=TIMEOUT)

    def unload(self, name: str) -> None:
        r = self.admin_post(f"{name}/unload")
        assert r.status_code == 200, r.text

    def chat(self, model: str | None, max_tokens: int = 4) -> httpx.Response:
        body: dict = {"messages": ASK, "max_tokens": max_tokens, "temperature": 0}
        if model is not None:
            body["model"] = model
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {API_KEY}"})

    def wait_state(self, name: str, wanted: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.state(name) != wanted:
            assert time.monotonic() < deadline, f"{name} is {self.state(name)}, not {wanted}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def office(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Office]:
    tiny_llama = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    tiny_qwen = shared_tiny_model("qwen2", tmp_path_factory, smollm2_dir)
    # The plan's own arithmetic: room for the default and one tiny model, not two (each
    # with the office profile's disk tier, whose buffers count).
    default = estimate_footprint(EngineConfig(dtype="float32", quantization="none",
                                              kv_cache_memory="256MiB", kv_disk_dir="auto"))
    tiny = max(estimate_footprint(EngineConfig(model=str(p), kv_disk_dir="auto",
                                               **TINY_OPTIONS)).total_bytes
               for p in (tiny_llama, tiny_qwen))
    budget = default.total_bytes + int(1.5 * tiny)
    with ServerProcess(*BASE_FLAGS, "--embedding-model", BUNDLED_EMBEDDER,
                       "--memory-budget", str(budget), engine_processes=True) as server:
        o = Office(server, tiny_llama, tiny_qwen)
        o.register("tiny-llama", tiny_llama)
        o.register("tiny-qwen", tiny_qwen)
        o.register("tiny-sleepy", tiny_llama, sleep_idle_seconds=SLEEPY_IDLE_S)
        o.register("tiny-huge", tiny_llama, options={**TINY_OPTIONS,
                                                     "kv_cache_memory": "64GiB"})
        yield o


def test_registered_models_are_listed_with_their_state_and_the_plans_fit(office):
    deadline = time.monotonic() + 30
    while (rows := office.models())["tiny-huge"]["fits"] is None:  # estimated in the background
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert rows["tiny-huge"]["fits"] is False and rows["tiny-qwen"]["fits"] is True
    assert rows["tiny-huge"]["state"] == "unloaded"
    assert any(row["default"] and row["state"] == "ready" for row in rows.values())
    assert rows[BUNDLED_EMBEDDER]["kind"] == "embed"


@pytest.mark.parametrize("change, message", [
    ({"pinned": None}, "pinned cannot be null"),
    ({"options": None}, "options cannot be null"),
    ({"options": {"max_model_len": "abc"}}, "max_model_len must be a whole number"),
])
def test_a_bad_change_to_a_registered_model_is_a_400_naming_it(office, change, message):
    r = httpx.patch(f"{office.url}/admin/models/tiny-qwen", json=change, headers=office.admin,
                    timeout=TIMEOUT)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert office.models()["tiny-qwen"]["options"] == TINY_OPTIONS  # nothing was written


def test_a_request_by_name_reaches_that_models_engine(office):
    before = scrape(office.server)
    answer = office.client.chat.completions.create(model="tiny-llama", messages=ASK,
                                                   max_tokens=5, temperature=0)
    after = scrape(office.server)
    assert answer.model == "tiny-llama"
    made = (sample(after, "vllm:generation_tokens_total", model_name="tiny-llama")
            - sample(before, "vllm:generation_tokens_total", model_name="tiny-llama"))
    assert made == answer.usage.completion_tokens


def test_admin_stats_has_each_models_own_rates_and_latency(office):
    # Rates are differences between the sampler's once-a-second readings of the engine's
    # counters: a model loaded by this request is read first after it is answered, so a
    # second request is what its rate shows.
    office.chat("tiny-llama", max_tokens=8)
    time.sleep(1.5)
    office.chat("tiny-llama", max_tokens=8)
    deadline = time.monotonic() + 10
    while True:  # the sampler reads the engines' counters once a second
        r = httpx.get(f"{office.url}/admin/stats", headers=office.admin, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        row = next(m for m in r.json()["models"] if m["name"] == "tiny-llama")
        if row["rates"]["generation_tokens_per_s"] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert row["rates"]["generation_tokens_per_s"] > 0
    assert row["latency"]["ttft_p50"] is not None
    assert set(row["latency"]) == set(r.json()["latency"])  # the top-level (default's) keys


def test_a_request_without_a_model_gets_the_default(office):
    r = office.chat(None)
    assert r.status_code == 200 and r.json()["model"] == office.default


def test_an_unknown_model_is_a_404_naming_it(office):
    r = office.chat("no-such-model")
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]


def test_a_first_request_loads_the_model_while_the_default_keeps_streaming(office):
    office.unload("tiny-qwen")
    office.unload("tiny-llama")
    arrivals: list[float] = []
    stream = office.client.chat.completions.create(
        model=office.default, messages=ASK, max_tokens=120, temperature=0, stream=True,
        extra_body={"min_tokens": 120})

    def read() -> None:
        for _ in stream:
            arrivals.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    while len(arrivals) < 5:
        time.sleep(0.01)
    t0 = time.monotonic()
    r = office.chat("tiny-qwen")
    t1 = time.monotonic()
    reader.join(TIMEOUT)
    assert r.status_code == 200, r.text
    during = [t for t in arrivals if t0 <= t <= t1]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if t0 <= b <= t1]
    print(f"load of tiny-qwen took {t1 - t0:.2f} s; the default's stream got {len(during)} "
          f"tokens meanwhile, longest gap {max(gaps, default=0) * 1000:.0f} ms")
    assert during, "the default model's stream stalled while another model loaded"


def test_concurrent_first_requests_share_one_load(office):
    office.unload("tiny-llama")
    wakes = sample(scrape(office.server), "officellm:model_wakes_total", model_name="tiny-llama")
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(office.chat("tiny-llama")
                                                              .status_code))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    after = sample(scrape(office.server), "officellm:model_wakes_total", model_name="tiny-llama")
    assert results == [200] * 4
    assert after - wakes == 1


def test_a_load_past_the_budget_unloads_the_least_recently_used_model(office):
    assert office.chat("tiny-llama").status_code == 200
    assert office.chat("tiny-qwen").status_code == 200
    assert office.state("tiny-qwen") == "ready"
    assert office.state("tiny-llama") == "unloaded"


def test_a_model_larger_than_the_budget_is_refused_with_the_sentence(office):
    r = office.chat("tiny-huge")
    message = r.json()["error"]["message"]
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert "tiny-huge" in message and "more than the memory budget" in message


def test_no_room_while_the_loaded_model_is_busy_names_what_is_loaded(office):
    assert office.chat("tiny-qwen").status_code == 200
    stream = office.client.chat.completions.create(
        model="tiny-qwen", messages=ASK, max_tokens=400, temperature=0, stream=True,
        extra_body={"min_tokens": 400})
    next(iter(stream))  # tiny-qwen is answering: it cannot be unloaded now
    try:
        r = office.chat("tiny-llama")
    finally:
        stream.close()
    message = r.json()["error"]["message"]
    assert r.status_code == 503
    assert "`tiny-qwen` (" in message and "in use by 1 request(s)" in message
    assert "GiB" in message


def test_an_idle_model_sleeps_and_its_next_request_wakes_it(office):
    office.unload("tiny-qwen")
    office.unload("tiny-llama")
    assert office.chat("tiny-sleepy").status_code == 200
    office.wait_state("tiny-sleepy", "sleeping", timeout=SLEEPY_IDLE_S + 20)
    assert office.chat("tiny-sleepy").status_code == 200
    assert office.state("tiny-sleepy") == "ready"


def test_embeddings_are_served_beside_the_generate_models(office):
    out = office.client.embeddings.create(model=BUNDLED_EMBEDDER, input=["a cat", "a dog"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == 384


def test_no_loaded_engine_holds_a_kv_block_once_its_requests_are_done(office):
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(f"{office.url}/admin/stats", headers=office.admin, timeout=TIMEOUT)
        loaded = [m for m in r.json()["models"] if m["num_blocks_used"] is not None]
        if all(m["num_blocks_used"] == 0 for m in loaded) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert loaded and all(m["num_blocks_used"] == 0 for m in loaded), loaded


def test_a_policy_restricting_models_refuses_others_with_403_naming_the_model(office):
    put = httpx.put(f"{office.url}/admin/policies/users/key1", json={"models": ["tiny-llama"]},
                    headers=office.admin, timeout=TIMEOUT)
    assert put.status_code == 200, put.text
    try:
        refused = office.chat("tiny-qwen")
        allowed = office.chat("tiny-llama")
    finally:
        httpx.delete(f"{office.url}/admin/policies/users/key1", headers=office.admin,
                     timeout=TIMEOUT)
    assert refused.status_code == 403
    assert "`tiny-qwen`" in refused.json()["error"]["message"]
    assert allowed.status_code == 200


def test_a_registered_embedding_model_loads_on_its_first_request_and_sleeps_when_idle(office):
    r = httpx.post(f"{office.url}/admin/models", headers=office.admin, timeout=TIMEOUT,
                   json={"name": "minilm-sleepy", "source": "bundled", "kind": "embed",
                         "sleep_idle_seconds": SLEEPY_IDLE_S})
    assert r.status_code == 201, r.text
    assert office.state("minilm-sleepy") == "unloaded"
    out = office.client.embeddings.create(model="minilm-sleepy", input="a cat")
    assert len(out.data[0].embedding) == 384
    office.wait_state("minilm-sleepy", "sleeping", timeout=SLEEPY_IDLE_S + 20)
    again = office.client.embeddings.create(model="minilm-sleepy", input="a cat")
    assert again.data[0].embedding == out.data[0].embedding


def test_a_pinned_model_loads_without_a_request_and_deleting_it_frees_it(office):
    for name in ("tiny-llama", "tiny-qwen", "tiny-sleepy"):
        office.unload(name)
    office.register("tiny-pinned", office.tiny_qwen, pinned=True)
    office.wait_state("tiny-pinned", "ready", timeout=60)
    r = httpx.delete(f"{office.url}/admin/models/tiny-pinned", headers=office.admin,
                     timeout=TIMEOUT)
    assert r.status_code == 204
    names = [m.id for m in office.client.models.list().data]
    assert "tiny-pinned" not in names
    assert "tiny-pinned" not in office.models()


def test_a_model_unloaded_for_another_reads_its_prompt_back_from_disk_when_loaded_again(
        office):
    """The office profile's KV disk tier (docs/kv_tiers.md) outlives an unload."""
    minutes = [{"role": "user", "content": "Summarise the minutes of Tuesday's meeting. " * 12}]

    def ask(model: str) -> httpx.Response:
        return httpx.post(f"{office.url}/v1/chat/completions", timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {API_KEY}"},
                          json={"model": model, "messages": minutes, "max_tokens": 4,
                                "temperature": 0})

    first = ask("tiny-llama")
    assert first.status_code == 200, first.text
    assert office.chat("tiny-qwen").status_code == 200  # the budget unloads tiny-llama
    assert office.state("tiny-llama") == "unloaded"
    again = ask("tiny-llama")
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    hits = sample(scrape(office.server), "vllm:external_prefix_cache_hits_total",
                  model_name="tiny-llama")
    assert hits >= 6 * 16  # the ~120-token prompt read back, all but its last blocks

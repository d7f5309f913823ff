"""POST /admin/plan: `officellm plan` over the admin API (the console's Capacity what-if).

The app in-process (Starlette's TestClient, so the real routes, auth and error handlers) with
an engine that never loads: the what-if needs no loaded model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.engine.config import parse_memory
from officellm.engine.kv_plan import format_plan, load_spec, make_plan
from tests.support.openai_errors import openai_error

QWEN = {"model": "Qwen2.5-7B-Instruct", "memory": "80GiB"}


def _never_loads():
    raise RuntimeError("no model in these tests")


@pytest.fixture
def admin(tmp_path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                              admin_remote=True)  # TestClient is no loopback client
    app = create_app(settings, _never_loads)
    headers = {"Authorization": f"Bearer {(tmp_path / 'admin_token').read_text().strip()}"}
    with TestClient(app) as client:
        yield client, headers


def test_the_what_if_is_officellm_plans_arithmetic_and_report(admin) -> None:
    client, headers = admin
    r = client.post("/admin/plan", json=dict(QWEN, avg_tokens=2000), headers=headers)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["bytes_per_token"] == 2 * 28 * 4 * 128 * 2 == 57344  # docs/design.md §4
    assert (plan["model"], plan["avg_tokens"], plan["kv_cache_dtype"]) == (
        "Qwen2.5-7B-Instruct", 2000, "auto")
    spec, name = load_spec("Qwen2.5-7B-Instruct")
    same = make_plan(spec, name, parse_memory("80GiB"), avg_tokens=2000)
    assert plan == same.to_dict()  # `officellm plan --json`
    assert r.json()["text"] == format_plan(same)  # `officellm plan`


def test_an_fp8_cache_halves_the_bytes_per_token(admin) -> None:
    client, headers = admin
    r = client.post("/admin/plan", json=dict(QWEN, kv_cache_dtype="fp8_e4m3"), headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["plan"]["bytes_per_token"] == 28_672
    assert "28,672" in r.json()["text"]


def test_a_gguf_on_the_cpu_is_planned_as_its_blocks(admin) -> None:
    from officellm.engine.loading.model_loader import bundled_model_path

    client, headers = admin
    gguf = {"model": str(bundled_model_path()), "memory": "4GiB", "dtype": "fp32"}
    on_cpu = client.post("/admin/plan", json=dict(gguf, device="cpu"), headers=headers)
    on_gpu = client.post("/admin/plan", json=gguf, headers=headers)
    assert on_cpu.status_code == on_gpu.status_code == 200, on_cpu.text
    held = on_cpu.json()["plan"]["weight_bytes"]
    assert held < 1.05 * bundled_model_path().stat().st_size  # the file's blocks
    assert on_gpu.json()["plan"]["weight_bytes"] > 4 * held  # dense float32 on a GPU


def test_the_what_if_answers_while_the_loaded_model_has_no_plan(admin) -> None:
    client, headers = admin
    assert client.get("/admin/plan", headers=headers).status_code == 503  # no model loaded
    r = client.post("/admin/plan", json={"model": "qwen2.5-7b-instruct"}, headers=headers)
    assert r.status_code == 200, r.text
    # officellm plan's defaults: 80GiB, bf16 weights, the model's own max length.
    plan = r.json()["plan"]
    assert plan["memory_bytes"] == 80 * 1024**3 and plan["dtype_bytes"] == 2
    assert plan["max_model_len"] == 32768 and plan["avg_tokens"] == 4000


@pytest.mark.parametrize(("change", "param", "words"), [
    ({"memory": "lots"}, "memory", "Cannot read a memory size"),
    ({"memory": "9" * 400}, "memory", "too large"),
    ({"dtype": "int3"}, "dtype", "Unknown dtype"),
    ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype", "Unknown kv_cache_dtype"),
    ({"model": "no-such-model"}, "model", "No model 'no-such-model'"),
    ({"model": ""}, "model", "at least 1 character"),
    ({"avg_tokens": 0}, "avg_tokens", "greater than or equal to 1"),
    ({"max_model_len": -5}, "max_model_len", "greater than or equal to 1"),
    ({"memory": 80}, "memory", "valid string"),
])
def test_a_bad_value_is_a_400_naming_its_field(admin, change, param, words) -> None:
    client, headers = admin
    error = openai_error(client.post("/admin/plan", json=dict(QWEN, **change), headers=headers),
                         400)
    assert error["param"] == param and words in error["message"], error


def test_a_missing_model_is_a_400_and_the_route_needs_the_admin_token(admin) -> None:
    client, headers = admin
    error = openai_error(client.post("/admin/plan", json={"memory": "8GiB"}, headers=headers), 400)
    assert error["param"] == "model"
    assert client.post("/admin/plan", json=QWEN).status_code == 401

"""The app in-process (Starlette's TestClient): loading/failed states, metric names, flags."""

from __future__ import annotations

import argparse
import logging
import threading

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from officellm.app.admission.auth import DatabaseAuthenticator, DeskAuthenticator
from officellm.app.db import Database, create_user, disable_user, issue_key, revoke_key
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.cli import build_parser
from officellm.cli.serve import settings_from_args
from officellm.engine import default_model_name

VLLM_NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}


def _sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _desk(tmp_path) -> ServerSettings:
    return ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"))


def test_health_503_while_loading_then_200(reference_llm, tmp_path) -> None:
    gate = threading.Event()

    def slow_factory():  # the real engine, handed over once the test lets "loading" end
        gate.wait(60)
        return reference_llm.llm_engine

    app = create_app(_desk(tmp_path), slow_factory)
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "loading" in r.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 503
        # Before the model is known there are no engine samples, but the text still parses.
        assert not _sample_names(client.get("/metrics").text) & VLLM_NAMES
        gate.set()
        assert app.state.server.default_model.async_engine.wait_ready(60)
        assert client.get("/health").json()["status"] == "ok"
        r = client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        names = _sample_names(client.get("/metrics").text)
    families = {n.removesuffix(s) for n in names for s in ("_bucket", "_count", "_sum", "")
                if n.endswith(s)}
    assert VLLM_NAMES <= families
    assert not any(n.endswith("_total_total") for n in names)


def test_models_lists_the_default_model_as_loading_then_ready(reference_llm, tmp_path) -> None:
    """Front ends poll /v1/models during a start: the model is listed at once, loading, under
    the id it keeps once loaded."""
    gate = threading.Event()

    def slow_factory():
        gate.wait(60)
        return reference_llm.llm_engine

    app = create_app(_desk(tmp_path), slow_factory)
    with TestClient(app) as client:
        r = client.get("/v1/models")
        assert r.status_code == 200, r.text
        [loading] = r.json()["data"]
        assert loading["state"] == "loading"
        gate.set()
        assert app.state.server.default_model.async_engine.wait_ready(60)
        [ready] = client.get("/v1/models").json()["data"]
    assert ready["state"] == "ready"
    assert loading["id"] == ready["id"] == reference_llm.llm_engine.model_name


def test_engine_failure_answers_503_and_is_logged(caplog: pytest.LogCaptureFixture,
                                                  tmp_path) -> None:
    def broken_factory():
        raise FileNotFoundError("no such model: /nowhere")

    with caplog.at_level(logging.ERROR, logger="officellm.async_engine"):
        app = create_app(_desk(tmp_path), broken_factory)
        with TestClient(app) as client:
            app.state.server.default_model.async_engine.wait_ready(10)
            r = client.get("/health")
            assert r.status_code == 503 and "no such model" in r.json()["error"]["message"]
            r = client.post("/v1/completions", json={"prompt": "x"})
            assert r.status_code == 503 and r.headers["retry-after"]
    assert "Loading the engine failed" in caplog.text


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_profile_defaults_and_flag_overrides() -> None:
    s, lines = settings_from_args(_args())
    assert s.profile == "office" and s.engine.max_num_batched_tokens == 1024
    assert s.max_context_tokens == 16384 and s.host == "127.0.0.1" and s.port == 8000
    assert "office" in lines[0]
    s, lines = settings_from_args(_args("--profile", "personal", "--max-num-batched-tokens", "512"))
    assert s.engine.max_num_batched_tokens == 512 and s.max_context_tokens is None
    assert any("flag overrides" in line for line in lines)
    s, _ = settings_from_args(_args("--profile", "product", "--max-context-tokens", "0",
                                    "--no-enable-prefix-caching", "--served-model-name", "m"))
    assert s.max_context_tokens is None and s.engine.enable_prefix_caching is False
    assert s.engine.gpu_memory_utilization == 0.8 and s.served_model_name == ["m"]
    with pytest.raises(ValueError):
        settings_from_args(_args("--no-auth", "--api-key", "k"))


def test_task_max_tokens_defaults_to_256_and_0_lifts_the_tasks_own_cap() -> None:
    assert settings_from_args(_args())[0].task_max_tokens == 256
    assert settings_from_args(_args("--task-max-tokens", "32"))[0].task_max_tokens == 32
    assert settings_from_args(_args("--task-max-tokens", "0"))[0].task_max_tokens is None
    with pytest.raises(ValueError, match="--task-max-tokens"):
        settings_from_args(_args("--task-max-tokens", "-1"))


def test_replica_flags_reach_the_settings_and_overlong_ones_are_refused() -> None:
    s, _ = settings_from_args(_args("--replica-name", "box-a", "--advertise-url",
                                    "http://10.0.0.11:8000", "--forwarded-allow-ips", "10.0.0.1"))
    assert (s.replica_name, s.advertise_url, s.forwarded_allow_ips) == (
        "box-a", "http://10.0.0.11:8000", "10.0.0.1")
    for bad in ("x" * 129, "box a", "box\r\nX-Injected: 1"):
        with pytest.raises(ValueError, match="--replica-name must be 1 to 128 letters"):
            settings_from_args(_args("--replica-name", bad))


def test_authenticators(tmp_path) -> None:
    db = Database(tmp_path / "officellm.db")
    db.upgrade()
    auth = DatabaseAuthenticator(db, ["alpha", "beta"])
    assert auth.authenticate("beta").user == "key2"
    assert auth.authenticate("gamma") is None and auth.authenticate(None) is None
    with db.transaction() as s:
        create_user(s, "ann")
        raw = issue_key(s, "ann").raw
    who = auth.authenticate(raw)
    assert who.user == "ann" and who.key_id is not None and not who.anonymous
    assert auth.authenticate(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None
    with db.transaction() as s:
        revoke_key(s, who.key_id)
    assert auth.authenticate(raw) is None  # the very next lookup
    with db.transaction() as s:
        disable_user(s, "key1")
    assert auth.authenticate("alpha") is None and auth.authenticate("beta").user == "key2"
    desk = DeskAuthenticator(db)
    assert desk.authenticate(None).anonymous and desk.authenticate("x").user == "local"
    db.close()


def test_admin_is_loopback_only_unless_admin_remote(tmp_path) -> None:
    """TestClient's peer is "testclient", not a loopback address."""
    def never_loads():
        raise RuntimeError("not needed")

    for remote, status in ((False, 403), (True, 200)):
        settings = ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                                  admin_remote=remote)
        app = create_app(settings, never_loads)
        token = (tmp_path / "admin_token").read_text().strip()
        with TestClient(app) as client:
            r = client.get("/admin/users", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == status, r.text
            if status == 403:
                assert r.json()["error"]["code"] == "admin_local_only"


def test_admin_stats_answers_before_any_model(tmp_path) -> None:
    """The console polls /admin/stats while the model loads or after it failed: 200 with
    the model's name and a null engine, not a 500 from its answer's schema."""
    def never_loads():
        raise RuntimeError("no model here")

    settings = ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                              admin_remote=True)
    app = create_app(settings, never_loads)
    token = (tmp_path / "admin_token").read_text().strip()
    with TestClient(app) as client:
        r = client.get("/admin/stats", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == default_model_name(None)  # the bundled model's, unloaded
        assert body["engine"] is None and body["ready"] is False
        assert body["active_threads"] == []
        r = client.get("/admin/plan", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"


def test_profiles_choose_the_scheduling_policy() -> None:
    assert settings_from_args(_args())[0].engine.scheduling_policy == "fair"  # office
    assert settings_from_args(_args("--profile", "product"))[0].engine.scheduling_policy == "fair"
    assert settings_from_args(_args("--profile", "personal"))[0].engine.scheduling_policy == "fcfs"
    s, lines = settings_from_args(_args("--scheduling-policy", "priority"))
    assert s.engine.scheduling_policy == "priority"
    assert any("scheduling_policy='priority' (flag overrides" in line for line in lines)


def test_admin_policy_priority_and_kv_share(tmp_path) -> None:
    def never_loads():
        raise RuntimeError("not needed")

    settings = ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                              admin_remote=True)
    app = create_app(settings, never_loads)
    headers = {"Authorization": f"Bearer {(tmp_path / 'admin_token').read_text().strip()}"}
    with TestClient(app) as client:
        assert client.post("/admin/users", json={"name": "ann"}, headers=headers).status_code == 201
        r = client.put("/admin/policies/users/ann", json={"priority": "high", "max_kv_share": 0.5},
                       headers=headers)
        assert r.status_code == 200, r.text
        assert (r.json()["priority"], r.json()["max_kv_share"]) == ("high", 0.5)
        policies = client.get("/admin/policies", headers=headers).json()
        assert policies["default"]["priority"] == "normal"
        assert policies["default"]["max_kv_share"] is None
        r = client.put("/admin/policies/users/ann", json={"max_kv_share": 1.5}, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_kv_share"
        r = client.put("/admin/policies/default", json={"priority": None}, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


def test_admin_policy_models(tmp_path) -> None:
    def never_loads():
        raise RuntimeError("not needed")

    settings = ServerSettings(no_auth=True, database=str(tmp_path / "officellm.db"),
                              admin_remote=True)
    app = create_app(settings, never_loads)
    headers = {"Authorization": f"Bearer {(tmp_path / 'admin_token').read_text().strip()}"}
    with TestClient(app) as client:
        assert client.post("/admin/users", json={"name": "ann"}, headers=headers).status_code == 201
        r = client.put("/admin/policies/default", json={"models": ["smollm2", "minilm"]},
                       headers=headers)
        assert r.status_code == 200 and r.json()["models"] == ["smollm2", "minilm"], r.text
        r = client.put("/admin/policies/users/ann", json={"models": ["qwen3-8b"]}, headers=headers)
        assert r.status_code == 200 and r.json()["models"] == ["qwen3-8b"], r.text
        policies = client.get("/admin/policies", headers=headers).json()
        assert policies["users"]["ann"]["models"] == ["qwen3-8b"]
        r = client.put("/admin/policies/default", json={"models": None}, headers=headers)
        assert r.status_code == 200 and r.json()["models"] is None
        r = client.put("/admin/policies/users/ann", json={"models": "qwen3-8b"}, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "models"


def test_a_chat_completions_stream_waiting_for_its_first_token_says_keepalive(
        reference_llm, tmp_path, monkeypatch) -> None:
    import openai

    from officellm.app.serving import heartbeats

    monkeypatch.setattr(heartbeats, "HEARTBEAT_INTERVAL_S", 0.001)  # every prefill is slow
    app = create_app(_desk(tmp_path), lambda: reference_llm.llm_engine)
    with TestClient(app) as client:
        assert app.state.server.default_model.async_engine.wait_ready(60)
        body = {**CHAT, "stream": True, "max_tokens": 4}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line]
        assert ": keepalive" in lines[:lines.index("data: [DONE]")]
        # The openai SDK skips the comments and reads the same answer.
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="desk", http_client=client)
        model = sdk.models.list().data[0].id
        chunks = list(sdk.chat.completions.create(model=model, stream=True, **CHAT))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
    assert chunks[-1].choices[0].finish_reason is not None

"""GET /admin/usage on the app in-process (the session's engine), on a SQLite file and on
PostgreSQL: its numbers are the requests the test made, as their answers counted them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from officellm.app.db.usage import utc_today
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings

# Long enough that the second asking finds whole blocks of it in the prefix cache.
INPUT = ("Summarise the office's printer policy: print double-sided, collect your pages at "
         "once, report jams to the front desk, and never print personal photographs. ") * 2
TASK = {"X-OpenWebUI-Task": "title_generation"}


@dataclass
class App:
    client: TestClient
    admin: dict[str, str]
    model: str

    def key_for(self, name: str) -> dict[str, str]:
        assert self.client.post("/admin/users", json={"name": name},
                                headers=self.admin).status_code == 201
        key = self.client.post("/admin/keys", json={"user": name}, headers=self.admin).json()
        return {"Authorization": f"Bearer {key['key']}"}

    def post(self, path: str, body: dict, headers: dict[str, str]) -> dict:
        r = self.client.post(path, json={"model": self.model, **body}, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    def usage(self, **params: str) -> dict:
        r = self.client.get("/admin/usage", params=params, headers=self.admin)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, reference_llm, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    monkeypatch.setenv("OFFICELLM_DATA_DIR", str(tmp_path))  # the admin token's place
    database = (str(tmp_path / "officellm.db") if request.param == "sqlite"
                else request.getfixturevalue("postgres").url())
    app = create_app(ServerSettings(database=database, admin_remote=True),
                     lambda: reference_llm.llm_engine)
    token = next(tmp_path.rglob("admin_token")).read_text().strip()
    with TestClient(app) as client:
        assert app.state.server.default_model.async_engine.wait_ready(60)
        yield App(client, {"Authorization": f"Bearer {token}"}, app.state.server.model_name)


def test_the_report_counts_each_request_as_its_answer_did(app: App) -> None:
    alice, bob = app.key_for("alice"), app.key_for("bob")
    asked = {"input": INPUT, "max_output_tokens": 3, "temperature": 0}
    first = app.post("/v1/responses", asked, alice)["usage"]
    again = app.post("/v1/responses", asked, alice)["usage"]
    # A front end's title task, by the header Open WebUI sends (app/policy/background_tasks.py).
    title = app.post("/v1/responses", {"input": "Name this chat.", "max_output_tokens": 2},
                     {**alice, **TASK})["usage"]
    done = app.post("/v1/completions", {"prompt": "One, two,", "max_tokens": 2}, bob)["usage"]

    by_user = {r["user"]: r for r in app.usage(by="user")["rows"]}
    a = by_user["alice"]
    answers = (first, again, title)
    assert a["requests"] == 3
    assert a["prompt_tokens"] == sum(u["input_tokens"] for u in answers)
    assert a["completion_tokens"] == sum(u["output_tokens"] for u in answers)
    assert a["cached_tokens"] == sum(u["input_tokens_details"]["cached_tokens"]
                                     for u in answers)
    assert again["input_tokens_details"]["cached_tokens"] > 0
    assert (a["task_requests"], a["task_tokens"]) == (1, title["total_tokens"])
    assert a["busy_seconds"] > 0
    b = by_user["bob"]
    assert (b["requests"], b["prompt_tokens"], b["completion_tokens"], b["task_requests"]) == (
        1, done["prompt_tokens"], done["completion_tokens"], 0)

    (model_row,) = app.usage(by="model")["rows"]
    assert (model_row["model"], model_row["user"], model_row["requests"]) == (app.model, None, 4)
    today = utc_today().isoformat()
    report = app.usage(by="day", since=today, until=today)
    assert [(r["day"], r["requests"]) for r in report["rows"]] == [(today, 4)]
    assert report["total"]["completion_tokens"] == a["completion_tokens"] + b["completion_tokens"]
    (bobs,) = app.usage(by="model", user="bob")["rows"]
    assert bobs["requests"] == 1


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # no database's own rule
def test_a_range_that_runs_backwards_or_before_the_year_1_or_an_unknown_user_is_refused(app: App) -> None:
    r = app.client.get("/admin/usage", params={"since": "2026-12-07", "until": "2026-12-01"},
                       headers=app.admin)
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"
    r = app.client.get("/admin/usage", params={"until": "0001-01-01"}, headers=app.admin)
    assert r.status_code == 400 and "before the year 1" in r.json()["error"]["message"]
    r = app.client.get("/admin/usage", params={"user": "nobody"}, headers=app.admin)
    assert r.status_code == 404 and r.json()["error"]["param"] == "user"

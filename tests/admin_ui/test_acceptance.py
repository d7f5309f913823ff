"""Acceptance 1, 3, 4 and 5 of issue 6: the console against a real `officellm serve` with the
admin API, started by the test with a small KV pool so that preemption can be forced.

Set OFFICELLM_DOCS_SCREENSHOTS=1 to also write docs/img/dashboard.png and threads.png.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from officellm.admin_ui.admin_client import AdminClient, AdminError, console_actor
from officellm.admin_ui.console_settings import REMOTE, ConsoleSettings
from officellm.admin_ui.local_server import LocalServer
from officellm.admin_ui.main_window import MainWindow
from officellm.admin_ui.models.record_table import RECORD_ROLE
from officellm.admin_ui.widgets.status_banner import UP
from tests.support.server_process import REPO, SMALL_POOL_FLAGS, ServerProcess

openai = pytest.importorskip("openai")

REFRESH_MS = 1000
# "Within one refresh": one poll interval, plus the request's own round trip on a busy box.
ONE_REFRESH_MS = REFRESH_MS + 1500


@pytest.fixture(scope="module")
def server(console_data_dir) -> Iterator[ServerProcess]:
    # No API key: users get theirs from the admin API, as in an office. The database and the
    # admin token live in the module's data dir, where the console looks for the token.
    srv = ServerProcess(*SMALL_POOL_FLAGS, api_key=None, data_dir=console_data_dir)
    try:
        srv.wait_ready()
        client = AdminClient(srv.base_url, srv.admin_token)
        try:
            client.stats()
        except AdminError as exc:
            if exc.status == 404:
                pytest.skip("the admin API (GET /admin/stats, docs/admin_api.md) is not in "
                            "this tree's server yet")
            raise
        finally:
            client.close()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def admin(server) -> Iterator[AdminClient]:
    client = AdminClient(server.base_url, server.admin_token, timeout=10)
    yield client
    client.close()


@pytest.fixture(scope="module")
def window(qapp, server, console_data_dir) -> Iterator[MainWindow]:
    settings = ConsoleSettings(mode=REMOTE, remote_url=server.base_url,
                               token_file=str(console_data_dir / "admin_token"),
                               poll_interval_ms=REFRESH_MS)
    w = MainWindow(settings, LocalServer(console_data_dir / "console"), use_tray=False,
                   show_dialogs=False)
    w.resize(1100, 760)
    w.show()
    yield w
    w.close()


def user_client(admin: AdminClient, server: ServerProcess, name: str) -> openai.OpenAI:
    try:
        admin.create_user(name)
    except AdminError as exc:
        if exc.status != 409:
            raise
    key = admin.issue_key(name)["key"]
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0,
                         timeout=300)


def model_name(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


class Load:
    """n concurrent chats that ignore EOS, so each really holds max_tokens of KV cache."""

    def __init__(self, client: openai.OpenAI, n: int, max_tokens: int) -> None:
        self.errors: list[Exception] = []
        model = model_name(client)

        def one(i: int) -> None:
            try:
                client.chat.completions.create(
                    model=model, max_tokens=max_tokens, temperature=0,
                    messages=[{"role": "user", "content": f"Count slowly from {i} to a thousand."}],
                    extra_body={"ignore_eos": True})
            except Exception as exc:  # noqa: BLE001 - reported by join()
                self.errors.append(exc)

        self.threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join(300)
        assert not self.errors, self.errors


def test_1_dashboard_kv_running_and_preemptions(qtbot, window, server, admin):
    qtbot.waitUntil(lambda: window.banner.state == UP, timeout=10_000)
    client = user_client(admin, server, "loadgen")
    before = admin.stats()["engine"]["num_preemptions_total"]
    # 3 x ~150 tokens > the pool's 352 tokens: the scheduler has to preempt.
    load = Load(client, 3, max_tokens=120)
    qtbot.waitUntil(lambda: admin.stats()["engine"]["num_running"] > 0, timeout=60_000)
    qtbot.waitUntil(lambda: window.dashboard.values["running"].text() not in ("—", "0")
                    and window.dashboard.gauge.value() > 0, timeout=ONE_REFRESH_MS)
    load.join()
    engine = admin.stats()["engine"]
    assert engine["num_preemptions_total"] > before, "the small pool did not force a preemption"
    expected = f"{engine['num_preemptions_total']:,}"
    qtbot.waitUntil(lambda: window.dashboard.values["preemptions"].text() == expected,
                    timeout=ONE_REFRESH_MS)
    # The diagnosis tab turns the rise into the plain-words warning.
    qtbot.waitUntil(lambda: any(f.rule == "kv_cache_full" for f in window.diagnosis.findings),
                    timeout=ONE_REFRESH_MS)


def test_4_threads_view_lists_multi_turn_chat(qtbot, window, server, admin):
    client = user_client(admin, server, "dana")
    model = model_name(client)
    messages = [{"role": "system", "content": "You are brief."}]
    usage = None
    for question in ("What is a cat?", "And a dog?", "Which is bigger?"):
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                               temperature=0)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        usage = reply.usage
    expected = usage.prompt_tokens + usage.completion_tokens  # docs/design.md §6: a thread's length

    def dana_rows():
        m = window.threads.model
        return [m.index(r, 0).data(RECORD_ROLE) for r in range(m.rowCount())
                if m.index(r, 0).data() == "dana"]

    qtbot.waitUntil(lambda: any(t.length == expected and t.turns == 3 for t in dana_rows()),
                    timeout=15_000)


def test_3_user_key_and_policy_through_the_ui(qtbot, window, server, admin):
    tab = window.users
    window.tabs.setCurrentWidget(tab)
    tab.name_edit.setText("erin")
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tab.select_user("erin"), timeout=10_000)
    qtbot.mouseClick(tab.issue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tab.last_key_dialog is not None, timeout=10_000)
    key = tab.last_key_dialog.field.text()
    qtbot.waitUntil(lambda: any(k.user == "erin" for k in tab.keys_model.records()),
                    timeout=10_000)

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0,
                           timeout=120)
    model = model_name(client)
    long_prompt = [{"role": "user", "content": "Please summarise in one line: " + "the quick "
                    "brown fox jumps over the lazy dog. " * 4}]
    ok = client.chat.completions.create(model=model, messages=long_prompt, max_tokens=4)
    assert ok.usage.prompt_tokens > 40

    # A policy for erin, edited in the UI: a 30-token cap, rejected with a sentence.
    pol = window.policies
    window.tabs.setCurrentWidget(pol)
    pol.refresh()
    qtbot.waitUntil(lambda: pol.target.findText("erin") >= 0, timeout=10_000)
    pol.select("erin")
    cap_edit = pol.int_edits["max_context_tokens"]
    cap_edit.clear()
    qtbot.keyClicks(cap_edit, "30")  # typed, as the admin would: marks the form edited
    pol.on_limit.setCurrentIndex(pol.on_limit.findData("reject"))
    qtbot.mouseClick(pol.save_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Saved" in pol.message.text(), timeout=10_000)

    with pytest.raises((openai.BadRequestError, openai.PermissionDeniedError)) as err:
        client.chat.completions.create(model=model, messages=long_prompt, max_tokens=4)
    assert "new chat" in str(err.value)

    # An invalid value is refused in the form, naming the field, and nothing is sent.
    qtbot.keyClicks(pol.int_edits["max_turns"], "0")
    qtbot.mouseClick(pol.save_button, Qt.MouseButton.LeftButton)
    assert "Max turns" in pol.message.text() and "Not saved" in pol.message.text()

    # The audit log says the console made each change, as the OS user running it.
    erins = {r["action"] for r in admin.audit(actor=console_actor())
             if r["target"] == "erin" or (r["after"] or {}).get("user_name") == "erin"}
    assert {"user.create", "key.issue", "policy.set"} <= erins


def test_5_screenshots_of_every_tab(qtbot, window, server, admin, tmp_path):
    # A cap for everyone, so the Threads view draws lengths against it.
    admin.put_default_policy({"max_context_tokens": 256})
    client = user_client(admin, server, "frank")
    model = model_name(client)
    for who, turns in (("frank", 2), ("dana", 1)):
        msgs = [{"role": "user", "content": f"Hello from {who}, tell me about tea."}]
        for _ in range(turns):
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=20)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "More, please."}]
    load = Load(client, 3, max_tokens=60)
    qtbot.waitUntil(lambda: window.last_snapshot is not None
                    and window.last_snapshot.engine.num_running >= 2, timeout=60_000)
    qtbot.wait(3000)  # a few more points on the live chart

    shots: dict[str, Path] = {}
    for i in range(window.tabs.count()):
        window.tabs.setCurrentIndex(i)
        qtbot.wait(50)
        name = window.tabs.tabText(i).replace("&&", "and").replace(" ", "_").lower()
        path = tmp_path / f"{name}.png"
        assert window.grab().save(str(path))
        assert path.stat().st_size > 5000
        shots[name] = path
    if os.environ.get("OFFICELLM_DOCS_SCREENSHOTS"):
        img = REPO / "docs" / "img"
        img.mkdir(parents=True, exist_ok=True)
        window.tabs.setCurrentWidget(window.dashboard)
        window.grab().save(str(img / "dashboard.png"))
        window.tabs.setCurrentWidget(window.threads)
        window.grab().save(str(img / "threads.png"))
    load.join()
    assert set(shots) >= {"dashboard", "threads", "users_and_keys", "policies", "diagnosis",
                          "capacity", "server"}


def test_6_capacity_tab_shows_the_servers_plan(qtbot, window, admin):
    """The Capacity tab's numbers are /admin/plan's, as the server answers them."""
    window.tabs.setCurrentWidget(window.capacity)
    plan = admin.plan()  # threads were seen today (tests 1 to 5): every ratio is a number
    assert plan["avg_thread_tokens"] and plan["threads_at_max_len"]
    expected = {"bpt": f"{plan['bytes_per_token']:,} B/token ({plan['kv_cache_dtype']})",
                "mml": f"{plan['max_model_len']:,} tokens",
                "avg": f"{plan['avg_thread_tokens']:,} tokens",
                "at_avg": f"{plan['threads_at_avg']:,.2f}x",
                "at_cap": f"{plan['threads_at_cap']:,.2f}x",
                "at_mml": f"{plan['threads_at_max_len']:,.2f}x"}
    values = window.capacity.values

    def shown() -> dict[str, str]:
        return {k: values[k].text() for k in expected}

    qtbot.waitUntil(lambda: shown() == expected, timeout=ONE_REFRESH_MS + 5000)
    assert values["model"].text() == plan["model"]
    assert values["pool"].text().startswith(f"{plan['kv_cache_tokens']:,} tokens ("
                                            f"{plan['num_blocks']:,} blocks of {plan['block_size']}")


def test_7_front_end_key_and_its_people_through_the_ui(qtbot, window, server, admin, tmp_path):
    """Issue 19: a front-end key issued from the Users & keys tab, with its JWT secret file;
    two Open WebUI people through it appear as two users "… via open-webui"."""
    jwt = pytest.importorskip("jwt")
    import time

    secret = "f" * 16 + "0123456789abcdef0123456789abcdef"
    secret_file = tmp_path / "owui.secret"
    secret_file.write_text(secret + "\n")
    tab = window.users
    window.tabs.setCurrentWidget(tab)
    tab.name_edit.setText("open-webui")
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tab.select_user("open-webui"), timeout=10_000)
    tab.issue_front_end_key("open-webui", secret_file)
    qtbot.waitUntil(lambda: tab.last_key_dialog is not None
                    and "front-end key, signed JWTs" in tab.message.text(), timeout=10_000)
    key = tab.last_key_dialog.field.text()
    qtbot.waitUntil(lambda: any(k.user == "open-webui" and k.kind == "front end (JWT)"
                                for k in tab.keys_model.records()), timeout=10_000)

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0,
                           timeout=120)
    model = model_name(client)
    for uid, email in (("u-1", "ann@example.com"), ("u-2", "ben@example.com")):
        now = int(time.time())
        token = jwt.encode({"sub": uid, "email": email, "name": email.split("@")[0],
                            "role": "user", "iss": "open-webui", "iat": now, "exp": now + 300},
                           secret, algorithm="HS256")
        client.chat.completions.create(model=model, max_tokens=1,
                                       messages=[{"role": "user", "content": "Hello"}],
                                       extra_headers={"X-OpenWebUI-User-Jwt": token,
                                                      "X-OpenWebUI-Chat-Id": f"chat-{uid}"})

    def labels() -> set[str]:
        m = tab.users_model
        return {m.index(r, 0).data() for r in range(m.rowCount())}

    tab.refresh()
    qtbot.waitUntil(lambda: {"ann@example.com via open-webui",
                             "ben@example.com via open-webui"} <= labels(), timeout=10_000)
    assert tab.select_user("ann@example.com")  # selected by name, for disable / keys


def test_8_models_tab_loads_and_unloads_a_registered_model(qtbot, window, admin,
                                                          tmp_path_factory, smollm2_dir):
    from officellm.admin_ui.models.registry_model import RegistryModel
    from tests.support.tiny_models import shared_tiny_model

    tiny = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    admin.add_model("tiny-console", source=str(tiny))
    tab = window.models
    state_column = [c.header for c in RegistryModel.columns].index("State")

    def state() -> str | None:
        row = tab.model.row_of("tiny-console")
        return None if row is None else tab.model.index(row, state_column).data()

    qtbot.waitUntil(lambda: state() == "unloaded", timeout=ONE_REFRESH_MS)
    assert tab.select_model("tiny-console")
    tab.load_button.click()
    qtbot.waitUntil(lambda: state() == "ready", timeout=120_000)
    assert {m["name"]: m["state"] for m in admin.models()["models"]}["tiny-console"] == "ready"
    assert tab.select_model("tiny-console")
    tab.unload_button.click()
    qtbot.waitUntil(lambda: state() == "unloaded", timeout=30_000)
    assert {m["name"]: m["state"] for m in admin.models()["models"]}["tiny-console"] == "unloaded"


def test_9_deleting_a_user_through_the_ui_refuses_their_key_and_forgets_their_cache(
        qtbot, window, server, admin):
    client = user_client(admin, server, "gwen")
    client.chat.completions.create(model=model_name(client), max_tokens=2, messages=[
        {"role": "user", "content": "Our office rules, in a line: " + "be kind. " * 30}])
    tab = window.users
    window.tabs.setCurrentWidget(tab)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.select_user("gwen"), timeout=10_000)
    qtbot.mouseClick(tab.delete_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Deleted gwen" in tab.message.text(), timeout=10_000)
    assert "cached context forgotten" in tab.message.text()
    qtbot.waitUntil(lambda: not tab.select_user("gwen"), timeout=10_000)  # the list refreshed
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert "gwen" not in [u["name"] for u in admin.users()]


def test_10_forgetting_a_users_cached_context_through_the_ui(qtbot, window, server, admin):
    client = user_client(admin, server, "hana")
    client.chat.completions.create(model=model_name(client), max_tokens=2, messages=[
        {"role": "user", "content": "Our office rules, in a line: " + "be on time. " * 30}])
    tab = window.users
    window.tabs.setCurrentWidget(tab)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.select_user("hana"), timeout=10_000)
    qtbot.mouseClick(tab.purge_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "hana: cached context forgotten" in tab.message.text(),
                    timeout=10_000)
    # Her prompt's blocks were in the pool.
    assert re.search(r"\(([1-9][0-9]*) blocks in the running models' memory", tab.message.text())
    assert client.models.list().data  # her key still works: only the cache went

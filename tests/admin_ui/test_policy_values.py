"""The policy form's validation: same rules as the server, named in plain words."""

from __future__ import annotations

import pytest

from officellm.admin_ui.policy_values import PolicyError, PolicyForm, form_to_policy

DEFAULT_POLICY = {"max_context_tokens": None, "max_turns": None, "on_limit": "reject",
                  "max_concurrent_requests": None, "max_tokens_per_day": None,
                  "share_prefix_cache": False, "priority": "normal", "max_kv_share": None,
                  "models": None, "audio_minutes_per_day": None}


def test_round_trip_default():
    stored = {"max_context_tokens": 8192, "max_turns": None, "on_limit": "notify",
              "max_concurrent_requests": 2, "max_tokens_per_day": None,
              "audio_minutes_per_day": None,
              "share_prefix_cache": False, "priority": "normal", "max_kv_share": 0.5,
              "models": None}
    assert form_to_policy(PolicyForm.from_policy(stored), is_default=True) == stored


def test_user_blanks_inherit():
    body = form_to_policy(PolicyForm(max_context_tokens="1,024"), is_default=False)
    assert body == {"max_context_tokens": 1024, "max_turns": None, "on_limit": None,
                    "max_concurrent_requests": None, "max_tokens_per_day": None,
                    "audio_minutes_per_day": None,
                    "share_prefix_cache": None, "priority": None, "max_kv_share": None,
                    "models": None}


@pytest.mark.parametrize("field,value,words", [
    ("max_context_tokens", "0", "at least 1"),
    ("max_turns", "ten", "whole number"),
    ("max_tokens_per_day", "-5", "at least 1"),
])
def test_bad_numbers_are_named(field, value, words):
    form = PolicyForm(on_limit="reject", share_prefix_cache="no", priority="normal",
                      **{field: value})
    with pytest.raises(PolicyError) as err:
        form_to_policy(form, is_default=True)
    assert field in err.value.problems and words in str(err.value)


def test_default_needs_on_limit_and_share():
    with pytest.raises(PolicyError) as err:
        form_to_policy(PolicyForm(), is_default=True)
    assert set(err.value.problems) == {"on_limit", "share_prefix_cache", "priority"}


def test_kv_share_reads_a_fraction_or_a_percentage():
    body = form_to_policy(PolicyForm(priority="high", max_kv_share="40%"), is_default=False)
    assert (body["priority"], body["max_kv_share"]) == ("high", 0.4)


@pytest.mark.parametrize("value", ["0", "1.5", "half", "-10%"])
def test_kv_share_outside_zero_to_one_is_named(value):
    with pytest.raises(PolicyError) as err:
        form_to_policy(PolicyForm(max_kv_share=value), is_default=False)
    assert set(err.value.problems) == {"max_kv_share"} and "at most 1" in str(err.value)


def test_policies_tab_round_trips_priority_and_kv_share(qtbot):
    from PySide6.QtCore import QObject, Signal

    from officellm.admin_ui.tabs.policies import PoliciesTab

    class Session(QObject):  # only what the tab touches before it talks to a server
        changed = Signal()

        def call(self, fn, done, failed) -> None:
            pass

    tab = PoliciesTab(Session())
    qtbot.addWidget(tab)
    tab.select("alice")  # a user's form: "(inherit)" is a choice
    tab.set_form(PolicyForm(priority="high", max_kv_share="0.5"))
    assert tab.priority.currentText() == "high (weight 2)"
    body = form_to_policy(tab.form(), is_default=False)
    assert (body["priority"], body["max_kv_share"]) == ("high", 0.5)


@pytest.mark.parametrize("models,text", [
    (["qwen3-8b", "minilm"], "qwen3-8b, minilm"),  # these two only
    (None, ""),  # every model (default) / the default's list (user)
    ([], "none"),  # no model at all
    (["none"], "none,"),  # a model named like the keyword keeps a comma
])
def test_models_round_trip_through_the_form(models, text):
    form = PolicyForm.from_policy({**DEFAULT_POLICY, "models": models})
    assert form.models == text
    assert form_to_policy(form, is_default=False)["models"] == models


@pytest.mark.parametrize("text,models", [
    (" qwen3-8b ,minilm,, qwen3-8b ", ["qwen3-8b", "minilm"]),  # trimmed, once each
    ("ALL", None),  # the CLI's word for blank
    ("None", []),
])
def test_models_text_is_read_like_the_cli(text, models):
    assert form_to_policy(PolicyForm(models=text), is_default=False)["models"] == models


@pytest.mark.parametrize("text", ["qwen3 8b", ",,", "x" * 129])
def test_bad_models_value_is_named(text):
    with pytest.raises(PolicyError) as err:
        form_to_policy(PolicyForm(models=text), is_default=False)
    assert set(err.value.problems) == {"models"}
    assert "Models this policy allows" in str(err.value)


class _FakeClient:
    """The AdminClient calls the Policies tab makes, answered from memory; PUTs recorded."""

    def __init__(self, policies: dict) -> None:
        self.policies_json = policies
        self.puts: list[tuple[str, dict]] = []

    def policies(self) -> dict:
        return self.policies_json

    def users(self) -> list[dict]:
        return [{"name": "alice"}]

    def models(self) -> dict:
        return {"models": [{"name": "qwen3-8b"}, {"name": "minilm"}]}

    def put_user_policy(self, user: str, policy: dict) -> dict:
        self.puts.append((user, policy))
        return policy

    def put_default_policy(self, policy: dict) -> dict:
        self.puts.append(("(default)", policy))
        return policy


def _tab_on(qtbot, client: _FakeClient):
    """A PoliciesTab whose session answers at once, on the GUI thread, from `client`."""
    from PySide6.QtCore import QObject, Signal

    from officellm.admin_ui.tabs.policies import PoliciesTab

    class Session(QObject):
        changed = Signal()

        def call(self, fn, done, failed) -> None:
            try:
                result = fn(client)
            except Exception as exc:  # noqa: BLE001 - handed to the tab, as the real one does
                failed(exc)
            else:
                done(result)

    tab = PoliciesTab(Session())
    qtbot.addWidget(tab)
    tab.refresh()
    return tab


def test_policies_tab_shows_a_users_models(qtbot):
    client = _FakeClient({"default": DEFAULT_POLICY,
                          "users": {"alice": {**DEFAULT_POLICY, "models": ["minilm"]}}})
    tab = _tab_on(qtbot, client)
    tab.select("alice")
    assert tab.models.text() == "minilm"


def test_policies_tab_sends_models_in_its_put(qtbot):
    from PySide6.QtCore import Qt

    client = _FakeClient({"default": DEFAULT_POLICY, "users": {}})
    tab = _tab_on(qtbot, client)
    tab.select("alice")
    qtbot.keyClicks(tab.models, "qwen3-8b,minilm")  # typed: marks the form edited
    assert tab.dirty
    qtbot.mouseClick(tab.save_button, Qt.MouseButton.LeftButton)
    assert "Saved" in tab.message.text()
    assert client.puts == [("alice", {**dict.fromkeys(DEFAULT_POLICY),
                                      "models": ["qwen3-8b", "minilm"]})]


def test_policies_tab_completes_the_name_after_the_last_comma(qtbot):
    from PySide6.QtCore import Qt

    tab = _tab_on(qtbot, _FakeClient({"default": DEFAULT_POLICY, "users": {}}))
    completer = tab.models_completer
    assert completer.model().stringList() == ["minilm", "qwen3-8b"]  # from GET /admin/models
    tab.show()  # focused, as when the admin types: QLineEdit wires its completer on focus-in
    qtbot.waitExposed(tab)
    tab.activateWindow()
    tab.models.setFocus()
    qtbot.waitUntil(tab.models.hasFocus)
    qtbot.keyClicks(tab.models, "minilm, qw")
    assert completer.popup().isVisible()
    qtbot.keyClick(completer.popup(), Qt.Key.Key_Down)
    qtbot.keyClick(completer.popup(), Qt.Key.Key_Return)
    assert tab.models.text() == "minilm, qwen3-8b" and tab.dirty

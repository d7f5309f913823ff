"""The policy form's validation: same rules as the server, named in plain words."""

from __future__ import annotations

import pytest

from officellm.admin_ui.policy_values import PolicyError, PolicyForm, form_to_policy


def test_round_trip_default():
    stored = {"max_context_tokens": 8192, "max_turns": None, "on_limit": "notify",
              "max_concurrent_requests": 2, "max_tokens_per_day": None,
              "share_prefix_cache": False, "priority": "normal", "max_kv_share": 0.5}
    assert form_to_policy(PolicyForm.from_policy(stored), is_default=True) == stored


def test_user_blanks_inherit():
    body = form_to_policy(PolicyForm(max_context_tokens="1,024"), is_default=False)
    assert body == {"max_context_tokens": 1024, "max_turns": None, "on_limit": None,
                    "max_concurrent_requests": None, "max_tokens_per_day": None,
                    "share_prefix_cache": None, "priority": None, "max_kv_share": None}


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

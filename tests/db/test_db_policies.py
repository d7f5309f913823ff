"""Policies: default + per-user override merge, validation, live changes."""

from __future__ import annotations

import pytest

from officellm.app.db.database import Database
from officellm.app.db.errors import NotFound
from officellm.app.db.policies import (
    StoredPolicy,
    clear_policy,
    get_effective_policy,
    get_policy,
    merge_policies,
    set_policy,
)
from officellm.app.db.users import create_user
from officellm.app.policy.types import EffectivePolicy


def test_fresh_default_is_unlimited(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        assert get_effective_policy(s, None) == EffectivePolicy()
        assert get_effective_policy(s, "alice") == EffectivePolicy()


def test_override_merges_onto_default(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        create_user(s, "bob")
        set_policy(s, None, max_context_tokens=8192, max_turns=40, on_limit="notify",
                   max_tokens_per_day=200_000)
        set_policy(s, "alice", max_context_tokens=32768, on_limit="truncate",
                   share_prefix_cache=True)
    with db.session() as s:
        alice = get_effective_policy(s, "alice")
        bob = get_effective_policy(s, "bob")
        stored = get_policy(s, "alice")
    assert alice == EffectivePolicy(max_context_tokens=32768, max_turns=40, on_limit="truncate",
                                    max_tokens_per_day=200_000, share_prefix_cache=True)
    assert bob == EffectivePolicy(max_context_tokens=8192, max_turns=40, on_limit="notify",
                                  max_tokens_per_day=200_000, share_prefix_cache=False)
    assert stored.max_turns is None and stored.max_context_tokens == 32768  # NULL = inherit

    # Changes apply to the next read, no cache to invalidate; None clears back to inherit.
    with db.transaction() as s:
        set_policy(s, "alice", max_context_tokens=None)
        set_policy(s, None, max_turns=None)
    with db.session() as s:
        alice = get_effective_policy(s, "alice")
        assert (alice.max_context_tokens, alice.max_turns) == (8192, None)
    with db.transaction() as s:
        assert clear_policy(s, "alice") is True
        assert clear_policy(s, "alice") is False
        assert get_effective_policy(s, "alice").on_limit == "notify"


def test_merge_is_per_field() -> None:
    default = StoredPolicy(user_id=None, max_context_tokens=4096, max_turns=10,
                           on_limit="reject", max_concurrent_requests=2,
                           max_tokens_per_day=None, share_prefix_cache=False)
    override = StoredPolicy(user_id=7, max_turns=99, max_tokens_per_day=5000)
    assert merge_policies(default, override) == EffectivePolicy(
        max_context_tokens=4096, max_turns=99, on_limit="reject", max_concurrent_requests=2,
        max_tokens_per_day=5000, share_prefix_cache=False)
    assert merge_policies(default, None).max_turns == 10


@pytest.mark.parametrize(("user", "fields", "message"), [
    (None, {"max_turns": 0}, "max_turns must be a whole number of at least 1, not 0"),
    (None, {"max_context_tokens": -5}, "max_context_tokens must be a whole number"),
    (None, {"max_tokens_per_day": "lots"}, "max_tokens_per_day must be a whole number"),
    (None, {"max_concurrent_requests": True}, "max_concurrent_requests must be a whole number"),
    (None, {"max_turns": 2.5}, "max_turns must be a whole number"),
    # SQLite's largest integer is the top (one more cannot be stored: a 500, found by fuzzing).
    (None, {"max_tokens_per_day": 2**63}, "max_tokens_per_day must be at most 9223372036854775807"),
    (None, {"on_limit": "explode"}, "on_limit must be one of reject, notify, truncate"),
    (None, {"on_limit": None}, "the default policy needs a value for on_limit"),
    (None, {"share_prefix_cache": None}, "the default policy needs a value for share_prefix"),
    ("alice", {"share_prefix_cache": "yes"}, "share_prefix_cache must be true or false"),
    ("alice", {"max_tokens": 5}, "unknown policy field 'max_tokens'"),
])
def test_validation(db: Database, user, fields, message) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
    with db.transaction() as s:
        with pytest.raises(ValueError, match=message):
            set_policy(s, user, **fields)
    with db.session() as s:  # nothing half-applied
        assert get_effective_policy(s, "alice") == EffectivePolicy()


def test_the_largest_limit_is_stored(db: Database) -> None:
    with db.transaction() as s:
        set_policy(s, None, max_tokens_per_day=2**63 - 1)
    with db.session() as s:
        assert get_effective_policy(s, None).max_tokens_per_day == 2**63 - 1


def test_user_row_may_clear_on_limit_to_inherit(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        set_policy(s, "alice", on_limit="truncate")
        set_policy(s, "alice", on_limit=None)
        assert get_effective_policy(s, "alice").on_limit == "reject"
        with pytest.raises(NotFound):
            set_policy(s, "nobody", max_turns=3)


def test_priority_and_kv_share_merge_onto_the_default(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        create_user(s, "bob")
        set_policy(s, None, max_kv_share=0.5)
        set_policy(s, "alice", priority="high", max_kv_share=0.25)
    with db.session() as s:
        alice, bob = get_effective_policy(s, "alice"), get_effective_policy(s, "bob")
        default = get_policy(s, None)
    assert (alice.priority, alice.max_kv_share) == ("high", 0.25)
    assert (bob.priority, bob.max_kv_share) == ("normal", 0.5)  # the default's
    assert default.priority == "normal"


def test_a_users_blank_kv_share_inherits_and_the_defaults_means_no_cap(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        set_policy(s, None, max_kv_share=0.5)
        set_policy(s, "alice", max_kv_share=0.25)
        set_policy(s, "alice", max_kv_share=None)
    with db.session() as s:
        assert get_effective_policy(s, "alice").max_kv_share == 0.5
    with db.transaction() as s:
        set_policy(s, None, max_kv_share=None)
    with db.session() as s:
        assert get_effective_policy(s, "alice").max_kv_share is None


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.01, float("nan"), "half", True])
def test_kv_share_outside_zero_to_one_is_refused(db: Database, value) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        with pytest.raises(ValueError, match="max_kv_share must be a fraction"):
            set_policy(s, "alice", max_kv_share=value)


def test_unknown_priority_is_refused_and_the_default_keeps_one(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        with pytest.raises(ValueError, match="priority must be one of low, normal, high"):
            set_policy(s, "alice", priority="urgent")
        with pytest.raises(ValueError, match="the default policy needs a value for priority"):
            set_policy(s, None, priority=None)


def test_models_default_to_every_model() -> None:
    assert EffectivePolicy().models is None


def test_a_users_models_replace_the_defaults(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        create_user(s, "bob")
        set_policy(s, None, models=["smollm2", "minilm"])
        set_policy(s, "alice", models=["qwen3-8b"])
    with db.session() as s:
        alice, bob = get_effective_policy(s, "alice"), get_effective_policy(s, "bob")
        stored = get_policy(s, "bob")
    assert alice.models == ("qwen3-8b",)
    assert bob.models == ("smollm2", "minilm")  # the default's, in its order
    assert stored.models is None  # NULL = inherit


def test_a_users_null_models_inherit_and_the_defaults_null_means_every_model(
        db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        set_policy(s, None, models=["smollm2"])
        set_policy(s, "alice", models=["qwen3-8b"])
        set_policy(s, "alice", models=None)
    with db.session() as s:
        assert get_effective_policy(s, "alice").models == ("smollm2",)
    with db.transaction() as s:
        set_policy(s, None, models=None)
    with db.session() as s:
        assert get_effective_policy(s, "alice").models is None


def test_an_empty_models_list_is_kept_apart_from_null(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        set_policy(s, "alice", models=[])
    with db.session() as s:
        assert get_effective_policy(s, "alice").models == ()


def test_models_are_stored_once_each_in_the_order_given(db: Database) -> None:
    with db.transaction() as s:
        set_policy(s, None, models=["b", "a", "b"])
    with db.session() as s:
        assert get_policy(s, None).models == ("b", "a")


def test_models_appear_in_the_policy_dicts_as_lists(db: Database) -> None:
    with db.transaction() as s:
        set_policy(s, None, models=["smollm2"])
    with db.session() as s:
        assert get_policy(s, None).to_dict()["models"] == ["smollm2"]
        assert get_effective_policy(s, None).to_dict()["models"] == ["smollm2"]


@pytest.mark.parametrize("value", ["smollm2", [""], ["two words"], [3], ["x" * 129]])
def test_models_that_are_not_a_list_of_names_are_refused(db: Database, value) -> None:
    with db.transaction() as s:
        with pytest.raises(ValueError, match="models must be a list of model names"):
            set_policy(s, None, models=value)

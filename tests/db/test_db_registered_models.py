"""The model registry's table: entries added, read back whole, changed, removed; a bad or
duplicate entry refused before anything is written."""

from __future__ import annotations

import pytest

from officellm.app.db.database import Database
from officellm.app.db.registered_models import (
    add_entry,
    get_entry,
    list_entries,
    remove_entry,
    update_entry,
)
from officellm.app.registry.entry import EMBED, ModelEntry

QWEN = ModelEntry(name="qwen3-8b", source="/models/Qwen3-8B", pinned=True,
                  aliases=("gpt-4*", "qwen*"), sleep_idle_seconds=600.0,
                  options={"dtype": "bfloat16", "max_model_len": 8192,
                           "kv_cache_memory": "4GiB", "tool_call_parser": "hermes"},
                  hub_repo="Qwen/Qwen3-8B")
MINILM = ModelEntry(name="minilm", source="bundled", kind=EMBED)


def test_an_entry_reads_back_equal_to_what_was_added(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, QWEN)
    with db.session() as s:
        assert get_entry(s, "qwen3-8b") == QWEN


def test_entries_are_listed_in_the_order_they_were_added(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, MINILM)
        add_entry(s, QWEN)
    with db.session() as s:
        assert list_entries(s) == [MINILM, QWEN]


def test_an_unknown_name_is_none(db: Database) -> None:
    with db.session() as s:
        assert get_entry(s, "nothing") is None
        assert list_entries(s) == []


def test_a_duplicate_name_is_refused_with_a_sentence(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, MINILM)
    with pytest.raises(ValueError, match="A model named 'minilm' is already registered"), \
            db.transaction() as s:
        add_entry(s, ModelEntry(name="minilm", source="/elsewhere"))
    with db.session() as s:
        assert list_entries(s) == [MINILM]


def test_an_invalid_entry_is_checked_before_it_is_stored(db: Database) -> None:
    with pytest.raises(ValueError, match="kind must be generate or embed"), \
            db.transaction() as s:
        add_entry(s, ModelEntry(name="x", source="bundled", kind="chat"))
    with db.session() as s:
        assert list_entries(s) == []


def test_remove_says_whether_there_was_an_entry(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, MINILM)
    with db.transaction() as s:
        assert remove_entry(s, "minilm") is True
        assert remove_entry(s, "minilm") is False
        assert get_entry(s, "minilm") is None


def test_update_changes_only_the_given_fields(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, QWEN)
    with db.transaction() as s:
        updated = update_entry(s, "qwen3-8b", pinned=False, aliases=["gpt-*"])
    with db.session() as s:
        stored = get_entry(s, "qwen3-8b")
    assert stored == updated
    assert (stored.pinned, stored.aliases) == (False, ("gpt-*",))
    assert (stored.sleep_idle_seconds, stored.options, stored.hub_repo) == \
        (QWEN.sleep_idle_seconds, QWEN.options, QWEN.hub_repo)


def test_update_replaces_the_options_and_can_clear_the_idle_sleep(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, QWEN)
        update_entry(s, "qwen3-8b", options={"quantization": "int8"}, sleep_idle_seconds=None)
    with db.session() as s:
        stored = get_entry(s, "qwen3-8b")
    assert (stored.options, stored.sleep_idle_seconds) == ({"quantization": "int8"}, None)


def test_update_of_an_unknown_name_is_none(db: Database) -> None:
    with db.transaction() as s:
        assert update_entry(s, "nothing", pinned=True) is None


def test_a_bad_update_leaves_the_row_as_it_was(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, QWEN)
    with pytest.raises(ValueError, match="tool_call_parser must be one of"), \
            db.transaction() as s:
        update_entry(s, "qwen3-8b", pinned=False, options={"tool_call_parser": "xml"})
    with db.session() as s:
        assert get_entry(s, "qwen3-8b") == QWEN


def test_update_refuses_fields_that_make_another_model(db: Database) -> None:
    with db.transaction() as s:
        add_entry(s, MINILM)
    with pytest.raises(ValueError, match="Cannot change kind, source"), db.transaction() as s:
        update_entry(s, "minilm", source="/other", kind="generate")


def test_a_dtype_the_engine_does_not_know_is_refused(db: Database) -> None:
    with pytest.raises(ValueError, match="dtype must be auto, float32, bfloat16 or float16"), \
            db.transaction() as s:
        add_entry(s, ModelEntry(name="x", source="bundled", options={"dtype": "int3"}))


@pytest.mark.parametrize("options, message", [
    ({"max_model_len": "abc"}, "max_model_len must be a whole number, not 'abc'"),
    ({"max_model_len": True}, "max_model_len must be a whole number, not True"),
    ({"dtype": 16}, "dtype must be a string, not 16"),
    ({"kv_cache_memory": ["4GiB"]}, "kv_cache_memory must be a string"),
])
def test_an_option_of_the_wrong_type_is_refused_with_a_sentence(options, message) -> None:
    """The admin API's JSON may carry any type; the check says which option is wrong."""
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        ModelEntry(name="x", source="bundled", options=options).check()

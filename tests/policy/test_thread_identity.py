"""Thread identity (docs/design.md §6) and the per-user prefix-cache salt."""

from __future__ import annotations

from officellm.app.policy.thread_identity import chat_thread, prefix_cache_salt, thread_key

SYSTEM = {"role": "system", "content": "You are helpful."}


def _turns(n: int, first: str = "Plan my week") -> list[dict]:
    msgs = [SYSTEM, {"role": "user", "content": first}]
    for i in range(1, n):
        msgs += [{"role": "assistant", "content": f"answer {i}"},
                 {"role": "user", "content": f"follow-up {i}"}]
    return msgs


def test_stable_across_turns_of_one_chat() -> None:
    keys = {thread_key(1, _turns(n)) for n in range(1, 8)}
    assert len(keys) == 1
    (key,) = keys
    assert key.startswith("h:") and len(key) <= 80


def test_differs_across_users_and_openings() -> None:
    base = thread_key(1, _turns(3))
    assert thread_key(2, _turns(3)) != base
    assert thread_key(None, _turns(3)) != base
    assert thread_key(1, _turns(3, first="Plan my month")) != base
    other_system = [{"role": "system", "content": "You are terse."}, *_turns(3)[1:]]
    assert thread_key(1, other_system) != base
    assert thread_key(1, _turns(3)[1:]) != base  # no system prompt is a different opening


def test_text_parts_and_plain_string_are_the_same_message() -> None:
    parts = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Plan "},
                                                  {"type": "text", "text": "my week"}]}]
    assert thread_key(1, parts) == thread_key(1, _turns(1))


def test_explicit_id_wins_and_is_per_user() -> None:
    a = thread_key(1, _turns(2), explicit_id="ticket-42")
    assert a.startswith("x:") and "ticket-42" not in a
    assert thread_key(1, _turns(5, first="something else"), explicit_id="ticket-42") == a
    assert thread_key(2, _turns(2), explicit_id="ticket-42") != a
    assert thread_key(1, _turns(2), explicit_id="ticket-43") != a
    assert thread_key(1, _turns(2), explicit_id="") == thread_key(1, _turns(2))


def test_prefix_cache_salt() -> None:
    assert prefix_cache_salt(1, share_prefix_cache=True) is None
    assert prefix_cache_salt(1, False) != prefix_cache_salt(2, False)
    assert prefix_cache_salt(1, False) == prefix_cache_salt(1, False)
    assert prefix_cache_salt(None, False) not in (None, prefix_cache_salt(1, False))


def test_open_webuis_chat_id_names_the_thread() -> None:
    # The same Open WebUI chat keeps its thread whatever its opening becomes (edited, or
    # regenerated), and another chat with the same messages is another thread.
    one = chat_thread(1, _turns(2), {"x-openwebui-chat-id": "chat-1"}, None)
    edited = chat_thread(1, _turns(3, first="Plan my month"), {"x-openwebui-chat-id": "chat-1"},
                         None)
    other = chat_thread(1, _turns(2), {"x-openwebui-chat-id": "chat-2"}, None)
    assert one.key == edited.key != other.key
    assert one.key is not None and one.key.startswith("x:")


def test_x_thread_id_comes_before_the_chat_id_and_the_user_field() -> None:
    by_thread_id = chat_thread(1, _turns(1), {"x-thread-id": "t"}, None)
    both = chat_thread(1, _turns(1), {"x-thread-id": "t", "x-openwebui-chat-id": "c"}, "u")
    assert both.key == by_thread_id.key
    assert chat_thread(1, _turns(1), {"x-openwebui-chat-id": "c"}, "u").key == \
        chat_thread(1, _turns(1), {"x-openwebui-chat-id": "c"}, None).key


def test_the_user_field_names_a_thread_only_when_passed() -> None:
    # A front-end key's `user` names a person, so the route passes None for it.
    assert chat_thread(1, _turns(1), {}, "u").key == thread_key(1, _turns(1), "u")
    assert chat_thread(1, _turns(1), {}, None).key == thread_key(1, _turns(1))


def test_a_background_task_belongs_to_no_thread() -> None:
    task = chat_thread(1, _turns(3), {"x-openwebui-task": "title_generation",
                                      "x-openwebui-chat-id": "chat-1"}, None)
    assert (task.key, task.task) == (None, "title_generation")

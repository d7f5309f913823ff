"""Open WebUI's background requests (titles, tags, follow-ups) are recognised, a person's turns
are not mistaken for them, and the limits they are held to (app/policy/background_tasks.py)."""

from __future__ import annotations

import pytest

from officellm.app.policy import EffectivePolicy, background_task, background_task_policy

SYSTEM = {"role": "system", "content": "You are the office assistant."}


def task_prompt(task: str, history: str = "USER: hello\nASSISTANT: hi!") -> str:
    """The shape of Open WebUI's default task prompts (open_webui/config.py): the task, its
    guidelines, then the chat between <chat_history> tags."""
    return (f"### Task:\n{task}\n### Guidelines:\n- Keep it short.\n### Output:\nJSON\n"
            f"### Chat History:\n<chat_history>\n{history}\n</chat_history>")


@pytest.mark.parametrize("task", ["Generate a concise title summarizing the chat history.",
                                  "Generate 1-3 broad tags categorizing the main themes.",
                                  "Predict 3-5 useful messages this user might send next."])
def test_open_webuis_default_task_prompts_are_tasks(task: str) -> None:
    assert background_task({}, [{"role": "user", "content": task_prompt(task)}]) is not None


def test_a_task_prompt_under_the_models_system_prompt_is_still_a_task() -> None:
    messages = [SYSTEM, {"role": "user", "content": task_prompt("Generate a title.") + "\n"}]
    assert background_task({}, messages) is not None


def test_a_task_prompt_in_content_parts_is_a_task() -> None:
    parts = [{"type": "text", "text": task_prompt("Generate a title.")}]
    assert background_task({}, [{"role": "user", "content": parts}]) is not None


def test_the_task_header_names_the_task() -> None:
    messages = [SYSTEM, {"role": "user", "content": "Tag this."}]
    assert background_task({"x-openwebui-task": "tags_generation"}, messages) == \
        "tags_generation"


def test_an_empty_task_header_is_a_persons_turn() -> None:
    # Open WebUI fills {{TASK}} with "" on a person's own message.
    assert background_task({"x-openwebui-task": ""}, [{"role": "user", "content": "Hi"}]) is None


def test_a_persons_message_is_no_task() -> None:
    assert background_task({}, [SYSTEM, {"role": "user", "content": "### Task: plan my week"}]) \
        is None


def test_a_rag_prompt_is_no_task() -> None:
    # Open WebUI's retrieval template also starts with "### Task:", around <context>.
    rag = "### Task:\nRespond to the user query using the provided context.\n<context>x</context>"
    assert background_task({}, [{"role": "user", "content": rag}]) is None


def test_a_task_prompt_later_in_a_chat_is_no_task() -> None:
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                {"role": "user", "content": task_prompt("Generate a title.")}]
    assert background_task({}, messages) is None


def test_a_task_has_no_turn_cap_and_is_never_a_notice() -> None:
    policy = EffectivePolicy(max_context_tokens=4096, max_turns=2, on_limit="notify",
                             max_tokens_per_day=1000)
    held = background_task_policy(policy)
    assert (held.max_turns, held.on_limit) == (None, "reject")
    assert (held.max_context_tokens, held.max_tokens_per_day) == (4096, 1000)

"""Open WebUI's background requests (titles, tags, follow-ups, queries, autocomplete) are
recognised, a person's turns are not mistaken for them, and the limits they are held to: the
policy's, and --task-max-tokens (app/policy/background_tasks.py)."""

from __future__ import annotations

import pytest

from officellm.app.policy import (
    EffectivePolicy,
    background_task,
    background_task_policy,
    runs_behind_people,
    task_max_tokens,
)
from officellm.app.serving.generation_pipeline import task_params
from officellm.engine import SamplingParams

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


def autocomplete_prompt(typed: str) -> str:
    """The shape of Open WebUI's DEFAULT_AUTOCOMPLETE_GENERATION_PROMPT_TEMPLATE."""
    return ("### Task:\nYou are an autocompletion system. Continue the text in `<text>`.\n"
            "### **Output Rules**:\n- Respond only in JSON format.\n---\n### Context:\n"
            "<chat_history>\nUSER: hello\n</chat_history>\n<type>General</type>  \n"
            f"<text>{typed}</text>  \n#### Output:\n")


def test_open_webuis_autocomplete_prompt_is_a_task() -> None:
    messages = [{"role": "user", "content": autocomplete_prompt("The budget for next")}]
    assert background_task({}, messages) == "autocomplete_generation"


def test_a_search_query_prompt_ending_in_a_newline_is_a_task() -> None:
    query = task_prompt("Analyze the chat history to determine search queries.") + "\n"
    assert background_task({}, [{"role": "user", "content": query}]) is not None


def test_text_after_the_chat_history_that_is_no_autocomplete_is_no_task() -> None:
    pasted = task_prompt("Generate a title.") + "\nAnd now answer my question about taxes."
    assert background_task({}, [{"role": "user", "content": pasted}]) is None


def test_a_task_without_max_tokens_gets_the_cap() -> None:
    assert task_max_tokens(None, 256) == 256


def test_a_tasks_explicit_max_tokens_under_the_cap_is_honoured() -> None:
    assert task_max_tokens(50, 256) == 50


def test_a_tasks_explicit_max_tokens_over_the_cap_is_cut_to_it() -> None:
    assert task_max_tokens(4096, 256) == 256


def test_a_task_without_max_tokens_gets_the_servers_default_when_that_is_smaller() -> None:
    assert task_max_tokens(None, 256, 100) == 100 and task_max_tokens(None, 256, 2048) == 256


def test_without_a_cap_a_task_keeps_what_it_asked_for() -> None:
    assert task_max_tokens(None, None) is None and task_max_tokens(4096, None) == 4096


def test_a_tasks_min_tokens_is_held_under_the_cap_too() -> None:
    params = task_params(SamplingParams(max_tokens=1000, min_tokens=500), 32)
    assert (params.max_tokens, params.min_tokens) == (32, 32)


@pytest.mark.parametrize("task", ["title_generation", "tags_generation", "follow_up_generation",
                                  "query_generation", "autocomplete_generation", "task_prompt"])
def test_background_tasks_run_behind_people(task: str) -> None:
    assert runs_behind_people(task)


@pytest.mark.parametrize("task", ["function_calling", "moa_response_generation"])
def test_tasks_a_persons_answer_waits_for_keep_the_persons_priority(task: str) -> None:
    assert not runs_behind_people(task)

"""evaluate(): thread limits before the engine, with a word counter and the real tokenizer."""

from __future__ import annotations

import pytest

from officellm.app.policy.evaluate import count_turns, drop_turns, evaluate
from officellm.app.policy.types import EffectivePolicy


def words(messages: list[dict]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def chat(n_turns: int, words_per_message: int = 10, system: str | None = "be brief") -> list[dict]:
    """A conversation of n_turns user messages, each but the last answered."""
    msgs: list[dict] = [{"role": "system", "content": system}] if system else []
    for t in range(n_turns):
        msgs.append({"role": "user", "content": " ".join([f"u{t}"] * words_per_message)})
        if t < n_turns - 1:
            msgs.append({"role": "assistant", "content": " ".join([f"a{t}"] * words_per_message)})
    return msgs


def test_allow_under_the_limits() -> None:
    msgs = chat(3)
    d = evaluate(EffectivePolicy(max_context_tokens=100, max_turns=3), msgs, words)
    assert d.action == "allow" and d.allowed and not d.refused
    assert (d.prompt_tokens, d.turns, d.status) == (words(msgs), 3, 200)
    # Exactly at the limit is still allowed: the limit is what may be reached.
    assert evaluate(EffectivePolicy(max_context_tokens=words(msgs)), msgs, words).action == "allow"


def test_no_token_limit_means_no_counting() -> None:
    def boom(_: list[dict]) -> int:
        raise AssertionError("count_tokens called without max_context_tokens")

    assert evaluate(EffectivePolicy(max_turns=10), chat(4), boom).action == "allow"


def test_reject_wording_is_design_6() -> None:
    d = evaluate(EffectivePolicy(max_context_tokens=8192, on_limit="reject"), chat(2),
                 lambda _: 9120)
    assert d.action == "reject" and d.status == 400 and d.refused and not d.allowed
    assert d.reason == "max_context_tokens"
    assert d.message == ("This chat has reached 9,120 tokens, over your limit of 8,192. "
                         "Please start a new chat.")


def test_notify_carries_the_same_sentence() -> None:
    d = evaluate(EffectivePolicy(max_context_tokens=8192, on_limit="notify"), chat(2),
                 lambda _: 1_234_567)
    assert d.action == "notify" and d.status == 200 and d.refused
    assert d.message == ("This chat has reached 1,234,567 tokens, over your limit of 8,192. "
                         "Please start a new chat.")


@pytest.mark.parametrize("on_limit", ["reject", "notify"])
def test_max_turns(on_limit: str) -> None:
    assert evaluate(EffectivePolicy(max_turns=3, on_limit=on_limit), chat(3), words).allowed
    d = evaluate(EffectivePolicy(max_turns=3, on_limit=on_limit), chat(4), words)
    assert d.action == on_limit and d.reason == "max_turns" and d.turns == 4
    assert d.message == ("This chat has reached 4 turns, over your limit of 3. "
                         "Please start a new chat.")


def test_token_sentence_wins_when_both_limits_fire() -> None:
    d = evaluate(EffectivePolicy(max_turns=1, max_context_tokens=5), chat(3), words)
    assert d.reason == "max_context_tokens" and "tokens" in d.message


def test_truncate_drops_fewest_oldest_turns() -> None:
    msgs = chat(6)  # system (2 words) + 6 user + 5 assistant messages, 10 words each
    assert words(msgs) == 2 + 110
    calls: list[int] = []

    def counting(m: list[dict]) -> int:
        calls.append(len(m))
        return words(m)

    # Each dropped turn removes 20 words; 112 - 3*20 = 52 <= 55 < 72 = 112 - 2*20.
    d = evaluate(EffectivePolicy(max_context_tokens=55, on_limit="truncate"), msgs, counting)
    assert d.action == "truncate" and d.allowed and not d.refused
    assert d.turns_dropped == 3 and d.reason == "max_context_tokens"
    assert (d.prompt_tokens, d.truncated_prompt_tokens, d.turns) == (112, 52, 6)
    assert d.messages == [msgs[0]] + msgs[7:]
    assert d.messages[0]["role"] == "system" and d.messages[-1] == msgs[-1]
    assert len(calls) <= 6  # binary search, not one count per turn


def test_truncate_for_max_turns() -> None:
    msgs = chat(5)
    d = evaluate(EffectivePolicy(max_turns=2, on_limit="truncate"), msgs, words)
    assert d.action == "truncate" and d.turns_dropped == 3 and d.reason == "max_turns"
    assert count_turns(d.messages) == 2 and d.messages == [msgs[0]] + msgs[7:]


def test_truncate_both_limits_takes_the_larger_cut() -> None:
    msgs = chat(6)
    d = evaluate(EffectivePolicy(max_turns=5, max_context_tokens=55, on_limit="truncate"),
                 msgs, words)
    assert d.turns_dropped == 3
    d = evaluate(EffectivePolicy(max_turns=2, max_context_tokens=95, on_limit="truncate"),
                 msgs, words)
    assert d.turns_dropped == 4 and d.truncated_prompt_tokens == 32


def test_truncate_rejects_when_latest_turn_alone_is_too_big() -> None:
    msgs = chat(3)
    msgs[-1]["content"] = " ".join(["big"] * 500)
    d = evaluate(EffectivePolicy(max_context_tokens=100, on_limit="truncate"), msgs, words)
    assert d.action == "reject" and d.status == 400 and d.reason == "max_context_tokens"
    assert d.message == (f"This chat has reached {words(msgs)} tokens, over your limit of 100. "
                         "Please start a new chat.")
    # A single-message chat has nothing to drop either.
    one = [{"role": "user", "content": " ".join(["x"] * 200)}]
    assert evaluate(EffectivePolicy(max_context_tokens=100, on_limit="truncate"), one,
                    words).action == "reject"


def test_drop_turns_keeps_system_messages_and_the_latest_exchange() -> None:
    msgs = [
        {"role": "assistant", "content": "Hello! How can I help?"},  # a UI's greeting
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "assistant", "content": "a1"},
        {"role": "developer", "content": "mid-chat instruction"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "prefill"},
    ]
    assert drop_turns(msgs, 0) == msgs
    assert drop_turns(msgs, 1) == [msgs[1], msgs[6], *msgs[7:]]
    assert drop_turns(msgs, 2) == [msgs[1], msgs[6], msgs[9], msgs[10]]
    with pytest.raises(ValueError):
        drop_turns(msgs, 3)


# --- the real tokenizer and chat template the engine uses -------------------------------

def test_truncate_with_smollm2_chat_template(smollm2_tokenizer) -> None:
    from officellm.engine.llm import apply_chat_template

    def count(m: list[dict]) -> int:
        return len(apply_chat_template(smollm2_tokenizer, m, add_generation_prompt=True))

    msgs = [{"role": "system", "content": "You are a helpful office assistant."}]
    for t in range(12):
        msgs.append({"role": "user", "content": f"Question {t}: summarise the quarterly report "
                                                f"section {t} in three sentences, please."})
        msgs.append({"role": "assistant", "content": f"Section {t} says revenue grew, costs "
                                                     f"fell and the outlook for item {t} is "
                                                     "stable. " * 3})
    msgs.append({"role": "user", "content": "And overall?"})
    total = count(msgs)
    limit = total // 3

    d = evaluate(EffectivePolicy(max_context_tokens=limit, on_limit="reject"), msgs, count)
    assert d.action == "reject" and d.prompt_tokens == total
    assert d.message == (f"This chat has reached {total:,} tokens, over your limit of "
                         f"{limit:,}. Please start a new chat.")

    d = evaluate(EffectivePolicy(max_context_tokens=limit, on_limit="truncate"), msgs, count)
    assert d.action == "truncate" and 0 < d.turns_dropped < 12
    assert d.truncated_prompt_tokens == count(d.messages) <= limit
    assert count(drop_turns(msgs, d.turns_dropped - 1)) > limit  # the fewest drops that fit
    assert d.messages[0] == msgs[0] and d.messages[-1] == msgs[-1]

    d = evaluate(EffectivePolicy(max_context_tokens=total), msgs, count)
    assert d.action == "allow" and d.prompt_tokens == total

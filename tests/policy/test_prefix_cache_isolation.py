"""Acceptance 6: two users sending the same long prompt share no cached blocks by default
(vllm:prefix_cache_hits_total does not move), and do when their policies allow sharing."""

from __future__ import annotations

from tests.policy.helpers import Office, metric

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def long_prompt(tag: str) -> list[dict[str, str]]:
    # The tag comes first, so no earlier test's blocks can match this prompt.
    system = f"[{tag}] You are the office assistant. " + "Answer politely and briefly. " * 40
    return [{"role": "system", "content": system}, {"role": "user", "content": "Hello!"}]


def hits_after(office: Office, key: str, messages) -> float:
    """Prefix-cache hits (tokens) caused by one request of `key`."""
    before = metric(office.metrics(key), "vllm:prefix_cache_hits_total")
    office.client(key).chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                              temperature=0)
    return metric(office.metrics(key), "vllm:prefix_cache_hits_total") - before


def test_no_cross_user_hits_by_default(office: Office, uniq) -> None:
    a = office.admin.user_with_key(f"pa-{uniq}")
    b = office.admin.user_with_key(f"pb-{uniq}")
    prompt = long_prompt(uniq)
    assert hits_after(office, a, prompt) == 0
    assert hits_after(office, b, prompt) == 0  # same prompt, other user: nothing shared
    assert hits_after(office, a, prompt) >= 160  # the same user does hit their own blocks


def test_hits_when_both_share(office: Office, uniq) -> None:
    c = office.admin.user_with_key(f"pc-{uniq}", share_prefix_cache=True)
    d = office.admin.user_with_key(f"pd-{uniq}", share_prefix_cache=True)
    e = office.admin.user_with_key(f"pe-{uniq}")  # does not share
    prompt = long_prompt(uniq)
    assert hits_after(office, c, prompt) == 0
    assert hits_after(office, d, prompt) >= 160
    assert hits_after(office, e, prompt) == 0

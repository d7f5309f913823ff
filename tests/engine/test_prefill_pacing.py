"""Prefill pacing: while others decode, a prompt's chunk is sized by measured step costs."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.prefill_pacer import PrefillPacer
from tests.engine.conftest import make_llm
from tests.engine.test_parity_smollm2 import GREEDY, _assert_all_match


def test_pacer_starts_with_its_first_chunk():
    assert PrefillPacer(2.0, first_chunk=64).prefill_cap() == 64


def test_pacer_sizes_chunk_to_the_allowed_slowdown():
    pacer = PrefillPacer(2.0)
    pacer.observe(num_decodes=8, num_prefill_tokens=0, seconds=0.040)
    pacer.observe(num_decodes=8, num_prefill_tokens=100, seconds=0.140)  # 1 ms per token
    # A step may cost 2 decode steps: 40 ms of prefill on top, 40 tokens.
    assert pacer.prefill_cap() == 40


def test_pacer_never_goes_below_its_minimum_chunk():
    pacer = PrefillPacer(1.5, min_chunk=16)
    pacer.observe(4, 0, 0.010)
    pacer.observe(0, 10, 1.0)  # 100 ms per token: a very slow machine
    assert pacer.prefill_cap() == 16


def test_pacer_follows_a_slowing_machine():
    pacer = PrefillPacer(3.0)
    pacer.observe(4, 0, 0.050)
    pacer.observe(4, 100, 0.150)
    fast = pacer.prefill_cap()
    for _ in range(10):  # later chunks attend over a longer prompt: dearer per token
        pacer.observe(4, 100, 0.450)
    assert pacer.prefill_cap() < fast / 2


def test_pacer_rejects_a_slowdown_of_one_or_less():
    with pytest.raises(ValueError, match="above 1"):
        PrefillPacer(1.0)


def _spy(engine) -> list[tuple[list[tuple[str, int]], int | None]]:
    """Each step's (request id, new tokens), with the pacer's cap when it was scheduled."""
    seen: list[tuple[list[tuple[str, int]], int | None]] = []
    original = engine.scheduler.schedule
    pacer = engine.scheduler.pacer

    def schedule():
        cap = pacer.prefill_cap() if pacer is not None else None
        so = original()
        seen.append(([(s.request.request_id, s.num_new_tokens) for s in so.scheduled], cap))
        return so

    engine.scheduler.schedule = schedule
    return seen


def test_a_long_prompt_is_paced_while_others_decode(smollm2_dir):
    engine = make_llm(smollm2_dir, max_num_batched_tokens=512, prefill_pacing=2.0).llm_engine
    engine.scheduler.pacer.first_chunk = 24
    engine.add_request("chat", [1, 2, 3], SamplingParams(temperature=0, max_tokens=60,
                                                         ignore_eos=True))
    engine.step()
    engine.add_request("doc", list(range(2000, 2400)), SamplingParams(temperature=0, max_tokens=2))
    seen = _spy(engine)
    for _ in range(4):
        engine.step()
    for sched, cap in seen:
        assert sched[0] == ("chat", 1)  # the typing user is never skipped
        assert dict(sched)["doc"] == min(cap, 512)
    engine.abort_request("chat")
    engine.abort_request("doc")


def test_a_prompt_alone_gets_the_whole_budget(smollm2_dir):
    engine = make_llm(smollm2_dir, max_num_batched_tokens=128, prefill_pacing=2.0).llm_engine
    seen = _spy(engine)
    engine.add_request("doc", list(range(2000, 2300)), SamplingParams(temperature=0, max_tokens=1))
    engine.step()
    assert seen[0][0] == [("doc", 128)]
    while engine.has_unfinished_requests():
        engine.step()


def test_paced_prefill_equals_transformers(smollm2_dir, chat_prompt_ids, smollm2_refs):
    llm = make_llm(smollm2_dir, prefill_pacing=1.5)
    pacer = llm.llm_engine.scheduler.pacer
    pacer.first_chunk = pacer.min_chunk = 8  # small chunks whatever this machine's speed
    engine = llm.llm_engine
    engine.add_request("warm", chat_prompt_ids[0], GREEDY)  # so later prompts meet decodes
    engine.step()
    outputs = llm.generate(chat_prompt_ids, GREEDY)
    _assert_all_match(outputs, smollm2_refs)
    engine.abort_request("warm")

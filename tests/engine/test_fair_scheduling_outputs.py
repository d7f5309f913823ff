"""Scheduling changes timing, never tokens: greedy outputs on the bundled SmolLM2 are the same
under fair and fcfs, though the two schedule (and preempt) differently."""

from __future__ import annotations

import pytest

from officellm.engine import OutputKind, SamplingParams
from tests.engine.conftest import MAX_NEW, make_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)


def _run(model_dir, prompts: list[list[int]], policy: str) -> tuple[dict, list, int]:
    """Token ids per request, the schedule step by step, and the preemptions."""
    # 24 blocks of 16 tokens: the eight chats cannot all stay resident, so both policies
    # preempt, and a small budget makes the order of prompt work matter.
    llm = make_llm(model_dir, kv_cache_memory=24 * 16 * 46080, enable_prefix_caching=False,
                   max_num_batched_tokens=64, scheduling_policy=policy)
    engine = llm.llm_engine
    scheduler = engine.engine_core.scheduler
    schedule = scheduler.schedule
    trace = []

    def spy():
        so = schedule()
        trace.append([(c.request.request_id, c.num_new_tokens) for c in so.chunks])
        return so

    scheduler.schedule = spy
    for i, ids in enumerate(prompts):
        # Five requests of one heavy key, three light keys, one of them weighted up.
        key = "heavy" if i < 5 else f"light{i}"
        engine.add_request(f"r{i}", ids, GREEDY, fairness_key=key,
                           priority=4.0 if i == 7 else 1.0, output_kind=OutputKind.FINAL)
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    return tokens, trace, engine.stats().num_preemptions_total


@pytest.mark.slow  # CI budget: docs/testing.md
def test_greedy_outputs_are_identical_under_fair_and_fcfs(smollm2_dir, chat_prompt_ids):
    fcfs_tokens, fcfs_trace, fcfs_preempted = _run(smollm2_dir, chat_prompt_ids, "fcfs")
    fair_tokens, fair_trace, fair_preempted = _run(smollm2_dir, chat_prompt_ids, "fair")
    assert fcfs_trace != fair_trace, "the two policies scheduled alike: the test proves little"
    assert fcfs_preempted > 0 and fair_preempted > 0
    assert len(fair_tokens) == len(chat_prompt_ids)
    assert fair_tokens == fcfs_tokens


def test_only_the_fair_engine_evicts_the_prefix_cache_by_owner(smollm2_dir):
    evicts = {policy: make_llm(smollm2_dir, scheduling_policy=policy)
              .llm_engine.engine_core.kv.pool.evict_by_owner
              for policy in ("fcfs", "priority", "fair")}
    assert evicts == {"fcfs": False, "priority": False, "fair": True}

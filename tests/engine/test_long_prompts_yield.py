"""A long prompt (more tokens left than a step's budget) yields to short ones, and while it is
chunked, the prompts a step finishes pace its chunk like decodes do: a chat sent during a
pasted document gets its first word in the next step, not after the whole paste
(engine/core/scheduler.py, docs/design.md §9). On the bare Scheduler, as in
test_scheduling_policy.py."""

from __future__ import annotations

import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.prefill_pacer import PrefillPacer
from officellm.engine.core.request import EngineCoreRequest, Request, RequestStatus
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.core.scheduler_output import SamplerOutput
from tests.engine.test_scheduling_policy import BLOCK, add, make_scheduler, run_to_end, step


def chunks(so) -> list[tuple[str, int]]:
    return [(c.request.request_id, c.num_new_tokens) for c in so.chunks]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_a_short_prompt_goes_ahead_of_a_long_prompts_next_chunk(policy):
    sched = make_scheduler(policy, budget=32)
    add(sched, "paste", 200, "office")
    assert chunks(step(sched)) == [("paste", 32)]
    add(sched, "chat", 8, "office")
    assert chunks(step(sched)) == [("chat", 8), ("paste", 24)]
    run_to_end(sched)


def test_a_waiting_long_prompt_is_admitted_after_a_short_one_behind_it():
    sched = make_scheduler("fcfs", budget=32)
    add(sched, "paste", 200, "office")
    add(sched, "chat", 8, "office")
    assert chunks(step(sched)) == [("chat", 8), ("paste", 24)]
    run_to_end(sched)


def test_a_long_prompts_last_chunk_keeps_its_place():
    """Once what is left fits a step, the prompt is short again: the policy's order holds."""
    sched = make_scheduler("fcfs", budget=32)
    add(sched, "paste", 50, "office")
    step(sched)  # 32 of 50: 18 left
    add(sched, "chat", 8, "office")
    assert chunks(step(sched)) == [("paste", 18), ("chat", 8)]
    run_to_end(sched)


def test_a_cached_history_does_not_make_a_prompt_long():
    """A chat's next turn resends its whole history; only the new tokens are work."""
    kv = KVCacheManager(256, BLOCK, enable_prefix_caching=True)
    sched = Scheduler(kv, 16, 32, max_model_len=100_000, policy="fcfs")
    first = add(sched, "turn1", 100, "office", max_tokens=1)
    run_to_end(sched)
    add(sched, "paste", 300, "office")
    step(sched)
    # The history (100 tokens, 25 blocks, cached) and 8 new tokens: 108 > the budget of 32.
    history = [*first.prompt_token_ids, 7]
    core = EngineCoreRequest("turn2", [*history, *range(60, 67)],
                             SamplingParams(temperature=0, max_tokens=1), fairness_key="office")
    sched.add_request(Request.from_core_request(core, frozenset()))
    so = step(sched)
    assert chunks(so)[0][0] == "turn2"
    assert so.chunks[0].start == 100  # the cached blocks were hits
    run_to_end(sched)


def test_a_preempted_request_resumes_in_its_place_though_its_recompute_is_long():
    sched = make_scheduler("fcfs", num_blocks=64, budget=32)
    resumed = add(sched, "resumed", 40, "office", max_tokens=1)
    sched.waiting.remove(resumed)  # as _preempt leaves it: at the queue's head, PREEMPTED
    resumed.status = RequestStatus.PREEMPTED
    sched.waiting.appendleft(resumed)
    add(sched, "chat", 8, "office", max_tokens=1)
    assert chunks(step(sched)) == [("resumed", 32)]
    run_to_end(sched)


def _seconds(decodes: int, tokens: int, pairs: int = 0) -> float:
    """20 ms a step + 2 ms a row (a decode or a prompt token) + 1 us an attention pair."""
    return 0.020 + 0.002 * (decodes + tokens) + 1e-6 * pairs


def _measured_pacer() -> PrefillPacer:
    pacer = PrefillPacer(2.0, min_chunk=4)
    for decodes, tokens in [(8, 0), (8, 100), (4, 50), (12, 0), (10, 30), (6, 200)]:
        pacer.observe(decodes, tokens, _seconds(decodes, tokens))
    return pacer


def timed_step(sched: Scheduler):
    """step(), but the pacer sees the step time the cost model above gives the batch."""
    so = sched.schedule()
    n = len(so.sampling_requests)
    seconds = _seconds(so.num_decodes, so.num_prefill_tokens,
                       so.prefill_context + so.decode_context)
    sched.update_from_output(so, SamplerOutput([7] * n, [None] * n, [False] * n), seconds)
    return so


def _paced_scheduler(pacer: PrefillPacer, budget: int = 256) -> Scheduler:
    kv = KVCacheManager(512, BLOCK, enable_prefix_caching=False)
    return Scheduler(kv, 16, budget, max_model_len=100_000, pacer=pacer, policy="fcfs")


def test_with_nobody_decoding_a_finished_prompt_paces_a_long_prompts_chunk():
    """The chat's user waits on this step for the first word: the paste's chunk gets the
    room of a step with one waiter, less what the chat's prompt took, not the whole budget."""
    pacer = _measured_pacer()
    sched = _paced_scheduler(pacer)
    add(sched, "paste", 2000, "office")
    assert chunks(timed_step(sched)) == [("paste", 256)]  # alone: the whole budget
    add(sched, "chat", 8, "office")
    context = sched.requests["paste"].num_computed_tokens
    expected = pacer.prefill_cap(1, context, spent=pacer.chunk_cost(8, 0))
    so = sched.schedule()
    assert chunks(so) == [("chat", 8), ("paste", expected)]
    assert 0 < expected < 256 - 8


def test_short_prompts_admitted_together_are_not_paced_by_one_another():
    """Each is at most a step's budget: a burst of chats starts in one step."""
    pacer = _measured_pacer()
    sched = _paced_scheduler(pacer, budget=64)
    for i in range(6):
        add(sched, f"chat{i}", 10, "office")
    # One waiter's room is 22 ms: 11 tokens; the six need 60.
    assert [n for _, n in chunks(sched.schedule())] == [10] * 6

"""Abort frees blocks at once; the scheduler honours its budget and sequence cap."""

from __future__ import annotations

from officellm.engine import SamplingParams
from tests.engine.conftest import make_llm

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


def test_abort_mid_generation_frees_every_block(smollm2_llm):
    engine = smollm2_llm.llm_engine
    engine.add_request("a", list(range(100, 150)), LONG)
    engine.add_request("b", list(range(300, 340)), LONG)
    for _ in range(5):
        engine.step()
    assert engine.stats().num_blocks_used > 0
    assert engine.abort_request("a")
    assert engine.stats().num_running == 1
    assert engine.abort_request("b")
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.num_blocks_used == 0
    assert not engine.abort_request("b")


def test_abort_of_a_waiting_request(smollm2_dir):
    llm = make_llm(smollm2_dir, max_num_seqs=1)
    engine = llm.llm_engine
    engine.add_request("first", [5, 6, 7], LONG)
    engine.add_request("queued", [8, 9, 10], LONG)
    engine.step()
    assert engine.stats().num_waiting == 1
    engine.abort_request("queued")
    engine.abort_request("first")
    assert engine.stats().num_waiting == 0 and engine.stats().num_blocks_used == 0


def _spy_on_schedule(engine) -> list:
    """Record every SchedulerOutput's (request id, new tokens) and the running count."""
    seen = []
    original = engine.engine_core.scheduler.schedule

    def schedule():
        so = original()
        seen.append(([(s.request.request_id, s.num_new_tokens) for s in so.chunks],
                     len(engine.engine_core.scheduler.running)))
        return so

    engine.engine_core.scheduler.schedule = schedule
    return seen


def test_step_never_exceeds_the_token_budget_or_sequence_cap(smollm2_dir):
    engine = make_llm(smollm2_dir, max_num_batched_tokens=32, max_num_seqs=3).llm_engine
    seen = _spy_on_schedule(engine)
    for i in range(5):
        engine.add_request(f"r{i}", list(range(1000 + 50 * i, 1040 + 50 * i)),
                           SamplingParams(temperature=0, max_tokens=5))
    while engine.has_unfinished_requests():
        engine.step()
    assert max(sum(n for _, n in sched) for sched, _ in seen) == 32
    assert max(running for _, running in seen) == 3


def test_decodes_are_scheduled_before_prefill_chunks(smollm2_dir):
    engine = make_llm(smollm2_dir, max_num_batched_tokens=16).llm_engine
    engine.add_request("chat", [1, 2, 3], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.step()  # the short chat's prefill
    engine.add_request("doc", list(range(2000, 2200)), SamplingParams(temperature=0, max_tokens=2))
    seen = _spy_on_schedule(engine)
    for _ in range(5):
        engine.step()
    # Every step: the chat's one decode token first, the document's chunk gets the rest.
    assert all(sched == [("chat", 1), ("doc", 15)] for sched, _ in seen)
    engine.abort_request("chat")
    engine.abort_request("doc")

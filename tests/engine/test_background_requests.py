"""Background requests (EngineCoreRequest.background: a front end's title, tags, follow-ups)
on the bare Scheduler, under every policy: they get nothing in a step that gives anyone
else prompt work, and give way first for blocks and running slots (engine/core/scheduler.py).
Deterministic, no model: every request samples token 7 and stops at max_tokens."""

from __future__ import annotations

import msgspec
import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import EngineCoreRequest, Request, RequestStatus
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.core_client.wire import Add, WireRequest
from tests.engine.test_scheduling_policy import run_to_end, step

BLOCK = 4
POLICIES = ["fcfs", "priority", "fair"]


def make_scheduler(policy: str, *, num_blocks: int = 64, budget: int = 32,
                   max_num_seqs: int = 16) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=False)
    return Scheduler(kv, max_num_seqs, budget, max_model_len=100_000, policy=policy)


def add(sched: Scheduler, rid: str, prompt_len: int, *, background: bool = False,
        max_tokens: int = 4, key: str = "1") -> Request:
    """A request of `key` (one person and their front end's tasks share a key)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    core = EngineCoreRequest(rid, [1 + i % 50 for i in range(prompt_len)], params,
                             fairness_key=key, background=background)
    req = Request.from_core_request(core, frozenset())
    sched.add_request(req)
    return req


def ids(so) -> set[str]:
    return {c.request.request_id for c in so.chunks}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_persons_waiting_prompt_runs_before_a_task_that_came_first(policy):
    sched = make_scheduler(policy)
    add(sched, "task", 8, background=True)
    add(sched, "person", 8)
    so = step(sched)
    assert ids(so) == {"person"}


@pytest.mark.parametrize("policy", POLICIES)
def test_tasks_decodes_wait_while_a_persons_prompt_is_computed(policy):
    sched = make_scheduler(policy, budget=8)
    add(sched, "tags", 4, background=True, max_tokens=50)
    add(sched, "follow_ups", 4, background=True, max_tokens=50)
    step(sched)
    assert ids(step(sched)) == {"tags", "follow_ups"}  # decoding
    add(sched, "person", 20)  # three chunks of 8
    for _ in range(3):
        assert ids(step(sched)) == {"person"}  # alone, as if the tasks were not there
    # Its prompt done, the person decodes beside the tasks.
    assert ids(step(sched)) == {"person", "tags", "follow_ups"}
    run_to_end(sched)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_task_gives_its_blocks_to_a_person(policy):
    # 6 blocks of 4: the task holds 4 of them, the person needs 3.
    sched = make_scheduler(policy, num_blocks=6, budget=32)
    task = add(sched, "task", 14, background=True, max_tokens=4)
    step(sched)
    person = add(sched, "person", 10)
    so = step(sched)
    assert ids(so) == {"person"}
    assert task.status is RequestStatus.PREEMPTED and person.status is RequestStatus.RUNNING
    run_to_end(sched)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_task_gives_its_running_slot_to_a_person(policy):
    sched = make_scheduler(policy, max_num_seqs=2)
    add(sched, "title", 4, background=True, max_tokens=20)
    add(sched, "tags", 4, background=True, max_tokens=20)
    step(sched)
    add(sched, "person", 4)
    assert ids(step(sched)) == {"person"}
    assert sorted(r.request_id for r in sched.running) == ["person", "title"]
    run_to_end(sched)


def test_tasks_run_in_every_step_without_anyone_elses_prompt():
    sched = make_scheduler("fair", budget=64)
    add(sched, "person", 4, max_tokens=30, key="2")
    step(sched)
    add(sched, "task", 12, background=True)
    # The person only decodes: the task's prompt runs beside it.
    assert ids(step(sched)) == {"person", "task"}
    run_to_end(sched)


def test_the_background_mark_crosses_to_an_engine_process():
    core = EngineCoreRequest("task", [1, 2, 3], SamplingParams(max_tokens=3), fairness_key="1",
                             background=True)
    frame = msgspec.msgpack.Encoder().encode(Add([WireRequest.of(core)]))
    (arrived,) = msgspec.msgpack.Decoder(Add).decode(frame).requests
    assert arrived.core_request(None).background is True

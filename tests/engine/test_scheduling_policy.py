"""Scheduling policies on the bare Scheduler: deterministic, no model (every request samples
token 7 and stops at max_tokens). What each test pins is in its name; the policies are
described in engine/core/scheduling_policy.py and docs/design.md §2."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import EngineCoreRequest, Request, RequestStatus
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.core.scheduler_output import SamplerOutput, SchedulerOutput

BLOCK = 4


def make_scheduler(policy: str, *, num_blocks: int = 64, budget: int = 32,
                   max_num_seqs: int = 16) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=False)
    return Scheduler(kv, max_num_seqs, budget, max_model_len=100_000, policy=policy)


def make_request(rid: str, prompt_len: int, key: str, *, max_tokens: int = 4,
                 priority: float = 1.0, cap: float | None = None) -> Request:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    core = EngineCoreRequest(rid, [1 + i % 50 for i in range(prompt_len)], params,
                             fairness_key=key, priority=priority, max_kv_share=cap)
    return Request.from_core_request(core, frozenset())


def add(sched: Scheduler, rid: str, prompt_len: int, key: str, **kw) -> Request:
    req = make_request(rid, prompt_len, key, **kw)
    sched.add_request(req)
    return req


def step(sched: Scheduler, seconds: Callable[[SchedulerOutput], float] | None = None
         ) -> SchedulerOutput:
    """One step: schedule, and every sampling request samples token 7; the step took
    `seconds(its batch)` (10 ms if not given)."""
    so = sched.schedule()
    n = len(so.sampling_requests)
    sched.update_from_output(so, SamplerOutput([7] * n, [None] * n, [False] * n),
                             0.01 if seconds is None else seconds(so))
    return so


def run_to_end(sched: Scheduler, max_steps: int = 100_000) -> None:
    """Step until every request has finished; then no block may be held (the scheduler-level
    twin of tests/conftest.py's leak check, which watches whole engines)."""
    for _ in range(max_steps):
        step(sched)
        if not sched.has_unfinished_requests():
            break
    else:
        raise AssertionError(f"requests still unfinished after {max_steps} steps")
    pool = sched.kv.pool
    assert pool.num_free_blocks == pool.num_blocks and not sched.kv.blocks_by_key


def admissions(so: SchedulerOutput) -> list[str]:
    """Ids of the requests whose first chunk (from position 0) this step runs."""
    return [c.request.request_id for c in so.chunks if c.start == 0]


def preempted_ids(sched: Scheduler, before: set[str]) -> set[str]:
    return {r.request_id for r in sched.waiting if r.status is RequestStatus.PREEMPTED} - before


# -- admission order ---------------------------------------------------------------------

def test_fair_admits_a_light_key_ahead_of_a_flooding_keys_queue():
    sched = make_scheduler("fair", budget=8, max_num_seqs=16)
    for i in range(5):
        add(sched, f"flood{i}", 8, "flood", max_tokens=1)
    add(sched, "chat", 8, "light", max_tokens=1)
    order = [rid for _ in range(6) for rid in admissions(step(sched))]
    # The flood's first request came first; the light key's one request goes next, ahead of
    # the flood's other four.
    assert order == ["flood0", "chat", "flood1", "flood2", "flood3", "flood4"]
    run_to_end(sched)


def test_fcfs_admits_in_arrival_order_whatever_the_key():
    sched = make_scheduler("fcfs", budget=8, max_num_seqs=16)
    for i in range(5):
        add(sched, f"flood{i}", 8, "flood", max_tokens=1)
    add(sched, "chat", 8, "light", max_tokens=1)
    order = [rid for _ in range(6) for rid in admissions(step(sched))]
    assert order == ["flood0", "flood1", "flood2", "flood3", "flood4", "chat"]
    run_to_end(sched)


def test_fair_admits_by_weight_two_to_one():
    sched = make_scheduler("fair", budget=8, max_num_seqs=16)
    for i in range(12):
        add(sched, f"low{i}", 8, "low", max_tokens=1, priority=1.0)
        add(sched, f"high{i}", 8, "high", max_tokens=1, priority=2.0)
    order = [rid for _ in range(12) for rid in admissions(step(sched))]
    counts = Counter(rid.rstrip("0123456789") for rid in order)
    assert counts == {"high": 8, "low": 4}
    # Within a key, first come first served.
    assert [r for r in order if r.startswith("high")] == [f"high{i}" for i in range(8)]
    run_to_end(sched)


def test_priority_policy_admits_higher_priority_first_and_fcfs_among_equals():
    sched = make_scheduler("priority", budget=8, max_num_seqs=16)
    add(sched, "low0", 8, "a", max_tokens=1, priority=0.5)
    add(sched, "normal0", 8, "b", max_tokens=1, priority=1.0)
    add(sched, "high0", 8, "c", max_tokens=1, priority=2.0)
    add(sched, "normal1", 8, "a", max_tokens=1, priority=1.0)
    order = [rid for _ in range(4) for rid in admissions(step(sched))]
    assert order == ["high0", "normal0", "normal1", "low0"]
    run_to_end(sched)


# -- preemption victim -------------------------------------------------------------------

def _full_pool(policy: str) -> tuple[Scheduler, set[str]]:
    """Nine blocks of 4: a (12 tokens), b (12), then c of another key (8) fill eight; the
    first decode step needs two more blocks, so someone must be preempted."""
    sched = make_scheduler(policy, num_blocks=9, budget=32)
    add(sched, "a", 12, "heavy", max_tokens=8)
    add(sched, "b", 12, "heavy", max_tokens=8)
    add(sched, "c", 8, "light", max_tokens=8)
    step(sched)  # all three prompts in one step, 8 of 9 blocks
    assert sched.kv.blocks_by_key == {"heavy": 6, "light": 2}
    before = preempted_ids(sched, set())
    step(sched)
    return sched, preempted_ids(sched, before)


def test_fair_preempts_the_newest_request_of_the_key_holding_most_blocks():
    sched, preempted = _full_pool("fair")
    assert preempted == {"b"}
    assert sched.preemptions_by_key == {"heavy": 1}
    run_to_end(sched)


def test_fcfs_preempts_the_newest_request_whoever_holds_the_cache():
    sched, preempted = _full_pool("fcfs")
    assert preempted == {"c"}
    assert sched.preemptions_by_key == {"light": 1}
    run_to_end(sched)


def test_fair_victim_counts_blocks_per_weight():
    # heavy holds 6 blocks at weight 4 (1.5 per weight); light 2 at weight 1 (2 per weight):
    # light is over its share, heavy is not.
    sched = make_scheduler("fair", num_blocks=9, budget=32)
    add(sched, "a", 12, "heavy", max_tokens=8, priority=4.0)
    add(sched, "b", 12, "heavy", max_tokens=8, priority=4.0)
    add(sched, "c", 8, "light", max_tokens=8, priority=1.0)
    step(sched)
    step(sched)
    assert preempted_ids(sched, set()) == {"c"}
    run_to_end(sched)


def test_preemption_warning_names_the_key_and_why(caplog):
    with caplog.at_level("WARNING", logger="officellm.engine.scheduler"):
        sched, _ = _full_pool("fair")
    message = next(r.getMessage() for r in caplog.records if "Preempted" in r.getMessage())
    assert "of key 'heavy'" in message
    assert "because its key holds the most KV blocks for its weight (7 blocks" in message
    assert "fair policy" in message
    run_to_end(sched)


# -- the share cap -----------------------------------------------------------------------

def test_share_cap_holds_back_only_the_key_over_it():
    sched = make_scheduler("fair", num_blocks=64, budget=48)
    # capped holds 12 of 64 blocks after its first chunk, over its 10% cap; uncapped holds as
    # many and has no cap.
    capped = add(sched, "capped", 200, "capped", cap=0.1)
    step(sched)
    uncapped = add(sched, "uncapped", 200, "uncapped")
    step(sched)
    assert sched.kv.blocks_by_key == {"capped": 12, "uncapped": 12}
    add(sched, "chat1", 8, "light1")
    add(sched, "chat2", 8, "light2")
    so = step(sched)
    ran = {c.request.request_id for c in so.chunks}
    assert ran == {"chat1", "chat2", "uncapped"}
    # The chats' 16 tokens, then uncapped's 32 fill the budget; capped stays where it was.
    assert capped.num_computed_tokens == 48 and uncapped.num_computed_tokens == 80
    run_to_end(sched)


def test_share_cap_yields_the_step_when_nothing_else_has_prompt_work():
    sched = make_scheduler("fair", num_blocks=64, budget=48)
    add(sched, "chat", 4, "light", max_tokens=50)
    capped = add(sched, "capped", 200, "capped", cap=0.1)
    step(sched)  # the chat's prompt and capped's first 44 tokens: 11 blocks, over its cap
    so = step(sched)  # the chat only decodes: capped's prompt takes the rest of the step
    assert [(c.request.request_id, c.num_new_tokens) for c in so.chunks] == \
        [("chat", 1), ("capped", 47)]
    assert capped.num_computed_tokens == 91
    run_to_end(sched)


def test_fcfs_ignores_the_share_cap():
    sched = make_scheduler("fcfs", num_blocks=64, budget=48)
    capped = add(sched, "capped", 80, "capped", cap=0.1)
    step(sched)  # 48 tokens: 12 blocks, over its cap of 6.4
    add(sched, "chat", 8, "light")
    so = step(sched)  # capped's running prompt first, though another key's prompt runs too
    assert [c.request.request_id for c in so.chunks] == ["capped", "chat"]
    assert capped.num_computed_tokens == 80
    run_to_end(sched)


# -- a lone key, and no starvation -------------------------------------------------------

def _random_workload(seed: int, keys: list[tuple[str, float, float | None]],
                     count: int) -> list[tuple[int, Request]]:
    """(arrival step, request) pairs: random prompt and output lengths, random keys."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key, weight, cap = rng.choice(keys)
        out.append((rng.randrange(0, 400),
                    make_request(f"r{i}", rng.randint(3, 120), key,
                                 max_tokens=rng.randint(1, 40), priority=weight, cap=cap)))
    return sorted(out, key=lambda p: p[0])


def _trace(policy: str, workload: list[tuple[int, Request]]) -> list[tuple]:
    """Every step's chunks (id, start, tokens) and preemptions, arrivals as scheduled."""
    sched = make_scheduler(policy, num_blocks=40, budget=64, max_num_seqs=6)
    pending = list(workload)
    trace = []
    for t in range(100_000):
        while pending and pending[0][0] <= t:
            sched.add_request(pending.pop(0)[1])
        if not pending and not sched.has_unfinished_requests():
            break
        so = step(sched)
        trace.append((tuple((c.request.request_id, c.start, c.num_new_tokens) for c in so.chunks),
                      so.num_preempted))
    assert not sched.has_unfinished_requests()
    assert sched.kv.pool.num_free_blocks == sched.kv.pool.num_blocks
    return trace


def test_a_lone_key_gets_exactly_the_fcfs_schedule():
    # One key, with a weight and a cap: fair must not slow it down nor reorder anything.
    def workload():
        return _random_workload(3, [("alone", 2.0, 0.3)], 120)

    fcfs, fair = _trace("fcfs", workload()), _trace("fair", workload())
    assert sum(p for _, p in fcfs) > 0, "the pool never filled: the test would prove little"
    assert fair == fcfs


def test_long_randomized_run_every_request_finishes_and_service_follows_weights():
    """Three keys, always backlogged (each topped up to four requests in the engine), weights
    1, 1 and 2, on a pool that holds about three requests (so it preempts all along). Over
    4,000 steps every key's service per unit of weight is within a factor of 1.5 of every
    other's (measured: 1.10), no request waits more than 600 steps for its first chunk
    (measured: 460, since a lighter key's request may be admitted by preempting a heavier
    key's, which then waits again; 272 without that; fcfs on the same load, 94: a weight-1
    key's queue drains at half the rate); then, arrivals stopped, every request finishes."""
    rng = random.Random(11)
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    sched = make_scheduler("fair", num_blocks=96, budget=64, max_num_seqs=6)
    service: Counter[str] = Counter()
    live: dict[str, set[str]] = {k: set() for k in weights}
    arrived: dict[str, int] = {}  # request -> step it arrived, until its first chunk
    waits: list[int] = []
    n = 0
    for t in range(4000):
        for key, w in weights.items():
            live[key] &= set(sched.requests)
            while len(live[key]) < 4:
                rid, n = f"{key}{n}", n + 1
                # At most 160 tokens: every request fits the 384-token pool on its own.
                sched.add_request(make_request(rid, rng.randint(4, 100), key,
                                               max_tokens=rng.randint(1, 60), priority=w))
                live[key].add(rid)
                arrived[rid] = t
        for c in step(sched).chunks:
            service[c.request.fairness_key] += c.num_new_tokens
            if c.request.request_id in arrived:
                waits.append(t - arrived.pop(c.request.request_id))
    assert sched.num_preemptions_total > 0, "the pool never filled: the test would prove little"
    per_weight = {k: service[k] / w for k, w in weights.items()}
    assert max(per_weight.values()) <= 1.5 * min(per_weight.values()), per_weight
    assert max(waits) < 600, f"a request waited {max(waits)} steps for its first chunk"
    run_to_end(sched)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_queue_time_is_reported_on_the_first_output_only(policy):
    sched = make_scheduler(policy, budget=8)
    first = add(sched, "first", 8, "a", max_tokens=3)
    second = add(sched, "second", 8, "b", max_tokens=3)
    # Arrived together (on a loaded machine the two add() calls can be further apart than
    # two steps): then the one admitted a step later has waited longer, deterministically.
    second.arrival_time = first.arrival_time
    outputs = []
    for _ in range(6):
        so = sched.schedule()
        k = len(so.sampling_requests)
        outputs += sched.update_from_output(so, SamplerOutput([7] * k, [None] * k, [False] * k),
                                            0.01)
    by_request: dict[str, list] = {}
    for out in outputs:
        by_request.setdefault(out.request_id, []).append(out.queue_time)
    for times in by_request.values():
        assert times[0] is not None and times[0] >= 0
        assert times[1:] == [None] * (len(times) - 1)
    assert by_request["second"][0] >= by_request["first"][0]  # it waited a step longer
    run_to_end(sched)


def test_fair_protects_the_oldest_running_request_once_it_has_been_preempted():
    # old (heavy key, 7 of 9 blocks) is the oldest running request. Fresh, it is the victim
    # (its key holds the most); once preempted, the light key's newer request goes instead:
    # a request preempted once always moves on when it is the oldest, so a request larger
    # than its key's share still finishes.
    sched = make_scheduler("fair", num_blocks=9, budget=32)
    old = add(sched, "old", 27, "heavy", max_tokens=8)  # 35 tokens: the whole pool, at the end
    new = add(sched, "new", 4, "light", max_tokens=4)
    step(sched)
    assert sched.running == [old, new] and sched.kv.blocks_by_key == {"heavy": 7, "light": 1}
    assert sched.policy.victim(sched.running)[0] is old
    old.num_preemptions = 1
    assert sched.policy.victim(sched.running)[0] is new
    run_to_end(sched)


# -- prefill pacing per key --------------------------------------------------------------

def test_fair_paces_a_heavier_keys_prompt_gently_while_a_lighter_key_decodes():
    sched = make_scheduler("fair")
    policy = sched.policy
    add(sched, "light", 8, "light")
    add(sched, "heavy", 400, "heavy")
    policy.charge({sched.requests["heavy"]: 400, sched.requests["light"]: 8})
    assert policy.prefill_pace("heavy", {"light": 1, "heavy": 2}, 2.0) == (3, 1.25)
    assert policy.prefill_pace("heavy", {"heavy": 3}, 2.0) == (3, 2.0)  # only itself decoding


def test_fair_paces_a_lighter_keys_prompt_only_for_decodes_within_their_fair_share():
    sched = make_scheduler("fair", num_blocks=64, budget=256)
    add(sched, "light", 8, "light")
    add(sched, "peer", 12, "peer")
    add(sched, "heavy", 200, "heavy")  # 50 of 64 blocks: over its third of the pool
    step(sched)
    policy = sched.policy
    assert policy.prefill_pace("light", {"peer": 2, "heavy": 3}, 2.0) == (2, 2.0)
    assert policy.prefill_pace("light", {"heavy": 3}, 2.0) is None  # the heavy decodes wait


def test_fair_paces_a_newcomers_first_prompt_for_everyone_decoding():
    sched = make_scheduler("fair", num_blocks=64, budget=256)
    add(sched, "light", 8, "light")
    add(sched, "peer", 12, "peer")
    step(sched)
    add(sched, "doc", 120, "new")  # holds nothing yet, has had no service
    assert sched.policy.prefill_pace("new", {"light": 1, "peer": 1}, 2.0) == (2, 2.0)


def test_fair_paces_a_heavier_keys_prompt_while_a_lighter_key_is_between_turns():
    sched = make_scheduler("fair")
    add(sched, "light", 8, "light")
    add(sched, "heavy", 400, "heavy")
    sched.policy.charge({sched.requests["heavy"]: 400, sched.requests["light"]: 8})
    sched.finish_requests(["light"], RequestStatus.FINISHED_STOPPED)  # reading the answer
    # Nothing decodes, yet the light key was just here: as if its one decode ran.
    assert sched.policy.prefill_pace("heavy", {}, 2.0) == (1, 2.0)


def test_a_lone_key_gets_the_whole_budget_when_nothing_decodes():
    sched = make_scheduler("fair")
    add(sched, "heavy", 400, "heavy")
    sched.policy.charge({sched.requests["heavy"]: 400})
    assert sched.policy.prefill_pace("heavy", {}, 2.0) is None


def test_fcfs_paces_every_prompt_alike():
    sched = make_scheduler("fcfs")
    assert sched.policy.prefill_pace("heavy", {"light": 3}, 2.0) == (3, 2.0)
    assert sched.policy.prefill_pace("heavy", {}, 2.0) is None


@pytest.mark.parametrize(("policy", "chunk"), [("fcfs", 20), ("fair", 5)])
def test_a_heavy_keys_chunk_beside_a_light_keys_decode_is_sized_by_the_policy(policy, chunk):
    from officellm.engine.core.prefill_pacer import PrefillPacer

    pacer = PrefillPacer(2.0, min_chunk=4)
    # 20 ms a step + 2 ms a row (a decode or a prompt token): a 10-decode step costs 40 ms,
    # room for 20 prompt tokens at 2x (fcfs) and for a quarter of that as a guest (fair).
    def seconds(so: SchedulerOutput) -> float:
        return 0.020 + 0.002 * so.num_tokens

    for decodes, tokens in [(8, 0), (8, 100), (4, 50), (12, 0), (10, 30), (6, 200)]:
        pacer.observe(decodes, tokens, 0.020 + 0.002 * (decodes + tokens))
    kv = KVCacheManager(512, BLOCK, enable_prefix_caching=False)
    sched = Scheduler(kv, 16, 256, max_model_len=100_000, pacer=pacer, policy=policy)
    for i in range(10):
        add(sched, f"light{i}", 4, "light", max_tokens=50)
    step(sched, seconds)  # the light key's prompts: from now on it decodes
    add(sched, "doc", 2000, "heavy")
    sched.policy.charge({sched.requests["doc"]: 4000})  # the heavy key's earlier documents
    so = step(sched)
    assert [c.num_new_tokens for c in so.chunks if c.request.request_id == "doc"] == [chunk]


# -- admission by preemption -------------------------------------------------------------

def _pool_full_of_heavy(policy: str) -> Scheduler:
    """16 blocks of 4 tokens, all held by two heavy requests."""
    sched = make_scheduler(policy, num_blocks=16, budget=64)
    add(sched, "h1", 30, "heavy", max_tokens=20)
    add(sched, "h2", 30, "heavy", max_tokens=20)
    step(sched)
    assert sched.kv.pool.num_free_blocks == 0
    return sched


def test_fair_admits_a_light_request_by_preempting_the_heaviest_keys_newest():
    sched = _pool_full_of_heavy("fair")
    add(sched, "light", 8, "light")
    so = step(sched)
    assert admissions(so) == ["light"]
    assert preempted_ids(sched, set()) == {"h2"}


def test_fcfs_makes_the_light_request_wait_for_blocks():
    sched = _pool_full_of_heavy("fcfs")
    add(sched, "light", 8, "light")
    so = step(sched)
    assert "light" not in admissions(so) and not preempted_ids(sched, set())


def test_a_key_that_would_go_over_its_share_is_not_admitted_by_preemption():
    sched = _pool_full_of_heavy("fair")
    add(sched, "big", 40, "other")  # 10 blocks: over its half of the pool
    so = step(sched)
    assert "big" not in admissions(so) and not preempted_ids(sched, set())


def test_admission_by_preemption_still_lets_everyone_finish():
    sched = _pool_full_of_heavy("fair")
    for i in range(6):
        add(sched, f"light{i}", 8, f"light{i % 3}", max_tokens=6)
    run_to_end(sched)

"""Prefill pacing: while others decode, a prompt's chunk is sized by measured step costs."""

from __future__ import annotations

import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.prefill_pacer import PrefillPacer
from tests.engine.conftest import MAX_NEW, make_llm
from tests.support.hf_reference import assert_all_match

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)


def test_pacer_starts_with_its_first_chunk():
    assert PrefillPacer(2.0, first_chunk=64).prefill_cap(8) == 64


def _feed(pacer: PrefillPacer, fixed: float, per_row: float,
          steps: list[tuple[int, int]]) -> None:
    """Steps of (decodes, prompt tokens) at `fixed` seconds + `per_row` a decode or token."""
    for decodes, tokens in steps:
        pacer.observe(decodes, tokens, fixed + per_row * (decodes + tokens))


def test_pacer_sizes_chunk_to_the_allowed_slowdown():
    pacer = PrefillPacer(2.0)
    # 20 ms a step + 1 ms a row (a decode or a prompt token), over varied steps.
    _feed(pacer, 0.020, 0.001, [(8, 0), (8, 100), (4, 50), (12, 0), (10, 30), (6, 200)])
    # A step of 10 decodes costs 30 ms: it may carry 30 ms of prompt, 30 tokens.
    assert pacer.prefill_cap(10) == 30
    assert pacer.prefill_cap(30) == 50  # more people typing: a dearer step, a larger chunk


def test_pacer_uses_the_current_batch_not_a_stale_decode_only_step():
    """Under load nearly every step carries a prompt: the only decode-only steps are from
    when few people were typing, yet the cap must follow today's batch."""
    pacer = PrefillPacer(2.0)
    _feed(pacer, 0.020, 0.001, [(2, 0), (3, 0)] + [(n, 40 + n) for n in range(20, 33)])
    assert pacer.prefill_cap(32) == 52  # (20 + 32) ms of decodes


def test_pacer_never_goes_below_its_minimum_chunk():
    pacer = PrefillPacer(1.5, min_chunk=16)
    _feed(pacer, 0.010, 0.1, [(4, 0), (4, 10), (2, 5), (4, 0)])  # 100 ms a row
    assert pacer.prefill_cap(4) == 16


def test_pacer_follows_a_slowing_machine():
    pacer = PrefillPacer(3.0, window=8)
    _feed(pacer, 0.020, 0.001, [(4, 0), (4, 100), (6, 50), (5, 0)])
    fast = pacer.prefill_cap(4)
    # The machine slows to a quarter (thermal throttling, a neighbour's job): every row
    # costs more, the fixed cost does not; old steps leave the window.
    _feed(pacer, 0.020, 0.004, [(4, 100), (5, 0), (6, 50), (4, 80)] * 2)
    assert pacer.prefill_cap(4) < fast / 2


def _paste_seconds(decodes: int, tokens: int, context: int, decode_context: int = 0) -> float:
    """A CPU-like step: 20 ms + 1 ms a row + 0.2 us an attention pair + 2 us a cached token
    the prompt chunk (starting `context` tokens in) reads."""
    pairs = tokens * context + decodes * decode_context
    return 0.020 + 0.001 * (decodes + tokens) + 2e-7 * pairs + 2e-6 * (context if tokens else 0)


def _observe(pacer: PrefillPacer, decodes: int, tokens: int, context: int,
             decode_context: int = 0) -> None:
    pacer.observe(decodes, tokens, _paste_seconds(decodes, tokens, context, decode_context),
                  tokens * context, decodes * decode_context, context if tokens else 0)


PASTE_STEPS = [(8, 0, 0), (8, 64, 500), (8, 32, 3000), (6, 0, 0), (8, 64, 100), (7, 48, 5000),
               (0, 512, 1000)]


def test_pacer_gives_a_long_context_smaller_chunks():
    """Attention makes a chunk deep into a long paste dearer per token than an early one."""
    pacer = PrefillPacer(2.0)
    for step in PASTE_STEPS:
        _observe(pacer, *step)
    assert pacer.prefill_cap(8, 5000) < pacer.prefill_cap(8, 0) / 1.5


def test_the_fit_recovers_every_cost_from_a_batch_that_never_changes():
    """Three people typing and a paste's few-token chunks in nearly every step (the long-doc
    case): a free fit put 0.8 s on the step and -0.26 s on each decode there. The costs come
    back exactly, and so does the chunk the true costs allow."""
    pacer = PrefillPacer(2.0, window=128)
    steps = [(3, 0, 0)] * 4 + [(3, 16 + i % 4, 2000 + 40 * i) for i in range(50)] + \
        [(0, 1024, 1000 * k) for k in range(1, 5)]
    for decodes, tokens, context in steps:
        _observe(pacer, decodes, tokens, context, decode_context=400)
    assert pacer.costs() == pytest.approx((0.020, 0.001, 2e-7, 2e-6), rel=1e-6)
    room = 0.020 + 3 * (0.001 + 2e-7 * 400)  # a decode-only step of these three: 2x allowed
    expected = round((room - 2e-6 * 3000) / (0.001 + 2e-7 * 3000))
    assert pacer.prefill_cap(3, 3000, decode_context=400) == expected


def test_a_chunk_pays_once_for_reading_its_cached_history():
    pacer = PrefillPacer(2.0, min_chunk=4)
    for step in PASTE_STEPS:
        _observe(pacer, *step)
    assert pacer.chunk_cost(0, 5000) == pytest.approx(2e-6 * 5000, rel=1e-6)
    # Where reading the history alone fills the room, the step's first chunk is min_chunk
    # and a later one gets nothing.
    assert pacer.prefill_cap(1, 20_000) == 4
    assert pacer.prefill_cap(1, 20_000, spent=pacer.chunk_cost(4, 0)) == 0


def _long_paste_pacer() -> PrefillPacer:
    pacer = PrefillPacer(2.0)
    for step in PASTE_STEPS:
        _observe(pacer, *step)
    return pacer


def test_a_step_full_of_a_long_pastes_chunk_leaves_no_room_for_a_short_prompt():
    """The room is time: a short prompt's cheap tokens do not ride on top of a paste chunk
    that took it all (counting tokens let the step cost two slowdowns' worth)."""
    pacer = _long_paste_pacer()
    paste = pacer.prefill_cap(8, 5000)
    assert pacer.prefill_cap(8, 0) >= 2 * paste  # alone, the short prompt gets twice as many
    assert pacer.prefill_cap(8, 0, spent=pacer.chunk_cost(paste, 5000)) == 0


def test_a_short_prompt_gets_the_time_a_smaller_paste_chunk_left():
    pacer = _long_paste_pacer()
    full = pacer.prefill_cap(8, 0)
    paste = pacer.prefill_cap(8, 5000) // 2  # the paste's last few tokens
    rest = pacer.prefill_cap(8, 0, spent=pacer.chunk_cost(paste, 5000))
    assert 0 < rest < full
    room = pacer.chunk_cost(full, 0)
    assert pacer.chunk_cost(paste, 5000) + pacer.chunk_cost(rest, 0) <= room * (1 + 1e-9)


def test_pacer_rejects_a_slowdown_of_one_or_less():
    with pytest.raises(ValueError, match="above 1"):
        PrefillPacer(1.0)


def _spy(engine) -> list[tuple[list[tuple[str, int]], int | None, int]]:
    """Each step's (request id, new tokens), with the cap the pacer gave the scheduler for
    that step's first prompt chunk and the document's tokens still to compute."""
    seen: list[tuple[list[tuple[str, int]], int | None, int]] = []
    sched = engine.engine_core.scheduler
    original_schedule = sched.schedule
    pacer = sched.pacer
    caps: list[int] = []
    if pacer is not None:
        original_cap = pacer.prefill_cap

        def prefill_cap(*args, **kwargs) -> int:
            caps.append(original_cap(*args, **kwargs))
            return caps[-1]

        pacer.prefill_cap = prefill_cap

    def schedule():
        doc = sched.requests.get("doc")
        left = doc.num_tokens - doc.num_computed_tokens if doc is not None else 0
        caps.clear()
        so = original_schedule()
        seen.append(([(s.request.request_id, s.num_new_tokens) for s in so.chunks],
                     caps[0] if caps else None, left))
        return so

    sched.schedule = schedule
    return seen


def test_a_long_prompt_is_paced_while_others_decode(smollm2_dir):
    engine = make_llm(smollm2_dir, max_num_batched_tokens=512, prefill_pacing=2.0).llm_engine
    engine.engine_core.scheduler.pacer.first_chunk = 24
    engine.add_request("chat", [1, 2, 3], SamplingParams(temperature=0, max_tokens=60,
                                                         ignore_eos=True))
    engine.step()
    engine.add_request("doc", list(range(2000, 2400)), SamplingParams(temperature=0, max_tokens=2))
    seen = _spy(engine)
    for _ in range(4):
        engine.step()
    for sched, cap, left in seen:
        assert sched[0] == ("chat", 1)  # the typing user is never skipped
        if left > 1:  # a chunk of the document is due: the pacer's cap, unless the budget or
            # what is left of the document is smaller (how far 4 steps get depends on the
            # measured step times)
            assert dict(sched)["doc"] == min(cap, 512, left)
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
    pacer = llm.llm_engine.engine_core.scheduler.pacer
    pacer.first_chunk = pacer.min_chunk = 8  # small chunks whatever this machine's speed
    engine = llm.llm_engine
    engine.add_request("warm", chat_prompt_ids[0], GREEDY)  # so later prompts meet decodes
    engine.step()
    outputs = llm.generate(chat_prompt_ids, GREEDY)
    assert_all_match(outputs, smollm2_refs)
    engine.abort_request("warm")

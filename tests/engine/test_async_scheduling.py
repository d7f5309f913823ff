"""Async scheduling (EngineConfig.async_scheduling): step N+1 is scheduled and launched before
step N's samples are read, its decodes taking N's tokens on the device. Outputs must be the
ones the serial loop gives, token for token, and nothing may leak.

On by default only on CUDA (a CPU gains nothing); here it is forced on, on the CPU, where
the same code runs: only the overlap itself needs a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from officellm.engine import EngineConfig, SamplingParams
from officellm.engine.frontend.output_processor import OutputKind
from tests.engine.conftest import make_llm
from tests.support.tiny_models import shared_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, smollm2_dir):
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


@dataclass
class Reply:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]],
        abort_at: dict[str, int] | None = None) -> dict[str, Reply]:
    """Add the requests, step until all finish (aborting `abort_at`'s after that many
    steps); each one's whole reply."""
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params, output_kind=OutputKind.FINAL)
    replies = {rid: Reply() for rid in requests}
    for step in range(1, 400):  # bounded: a request that never ends fails, not hangs
        if not engine.has_unfinished_requests():
            break
        for rid, when in (abort_at or {}).items():
            if when == step:
                engine.abort_request(rid)
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                replies[out.request_id] = Reply(list(c.token_ids), c.finish_reason, out.error)
    assert not engine.has_unfinished_requests()
    return replies


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens)


def mixed_requests() -> dict[str, tuple[list[int], SamplingParams]]:
    """Prompts of several lengths (one longer than a step's budget below), answers that
    end at different steps."""
    return {
        f"r{i}": (list(range(100 + 37 * i, 100 + 37 * i + n)),
                  SamplingParams(temperature=0, ignore_eos=True, max_tokens=m))
        for i, (n, m) in enumerate([(5, 12), (40, 3), (90, 20), (17, 1), (60, 9), (8, 16)])
    }


def test_greedy_replies_equal_the_serial_loops(tiny_llama):
    serial = run(make_llm(tiny_llama, async_scheduling=False).llm_engine, mixed_requests())
    ahead = run(make_llm(tiny_llama, async_scheduling=True).llm_engine, mixed_requests())
    assert ahead == serial
    assert [len(r.token_ids) for r in ahead.values()] == [12, 3, 20, 1, 9, 16]


def test_chunked_prefill_and_the_prefix_cache_give_the_same_replies(tiny_llama):
    shared = list(range(200, 264))  # four blocks another request has computed already
    requests = {"first": (shared + [7, 8], greedy(10)),
                "second": (shared + [9], greedy(10))}
    kwargs = dict(max_num_batched_tokens=24)
    serial = run(make_llm(tiny_llama, async_scheduling=False, **kwargs).llm_engine,
                 requests)
    engine = make_llm(tiny_llama, async_scheduling=True, **kwargs).llm_engine
    assert run(engine, requests) == serial
    assert engine.stats().prefix_cache_hits >= 48


def tokens_read_on_the_device(engine) -> list[int]:
    """Per step from now on: how many input tokens the runner takes from the previous
    step's samples on the device (tokens the host has not read yet)."""
    runner = engine.engine_core.runner
    counts: list[int] = []
    batch_for = runner.batch_for

    def spy(so):
        batch, sampling = batch_for(so)
        counts.append(len(batch.from_previous))
        return batch, sampling

    runner.batch_for = spy  # an instance attribute: only this engine is watched
    return counts


def test_the_next_step_is_launched_before_the_previous_one_is_read(tiny_llama):
    """The overlap itself: every decode step after the first takes its input token from the
    step before on the device, scheduled while that step's samples were still unread."""
    engine = make_llm(tiny_llama, async_scheduling=True).llm_engine
    on_device = tokens_read_on_the_device(engine)
    run(engine, {"a": ([1, 2, 3], greedy(6)),
                 "b": ([4, 5, 6, 7], greedy(6))})
    # Step 1 prefills both; steps 2-6 decode both from the tokens still on the device.
    assert on_device == [0, 2, 2, 2, 2, 2]


def test_the_serial_loop_reads_every_token_before_the_next_step(tiny_llama):
    engine = make_llm(tiny_llama, async_scheduling=False).llm_engine
    on_device = tokens_read_on_the_device(engine)
    run(engine, {"a": ([1, 2, 3], greedy(6))})
    assert on_device == [0] * 6


def test_a_stop_token_ends_the_reply_where_the_serial_loop_ends_it(tiny_llama):
    free = run(make_llm(tiny_llama, async_scheduling=False).llm_engine,
               {"x": ([11, 12, 13], greedy(12))})["x"].token_ids
    stop = free[4]
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop])
    engine = make_llm(tiny_llama, async_scheduling=True).llm_engine
    reply = run(engine, {"x": ([11, 12, 13], params)})["x"]
    assert reply.finish_reason == "stop"
    assert reply.token_ids == free[: free.index(stop) + 1]
    assert engine.stats().num_blocks_used == 0


def test_max_model_len_ends_the_reply_without_a_step_past_it(tiny_llama):
    requests = {"x": (list(range(30, 80)), SamplingParams(temperature=0, ignore_eos=True))}
    serial = run(make_llm(tiny_llama, async_scheduling=False, max_model_len=64).llm_engine,
                 requests)
    ahead = run(make_llm(tiny_llama, async_scheduling=True, max_model_len=64).llm_engine,
                requests)
    assert ahead == serial
    assert ahead["x"].finish_reason == "length" and len(ahead["x"].token_ids) == 14


def test_preemption_and_aborts_leave_no_block_behind(tiny_llama):
    """A pool too small for everyone: requests are preempted (some with a token in flight)
    and resumed; two are aborted mid-reply. The rest equal the serial loop's replies."""
    requests = {f"p{i}": (list(range(50 + 61 * i, 50 + 61 * i + 40)),
                          SamplingParams(temperature=0, ignore_eos=True, max_tokens=60))
                for i in range(6)}
    aborts = {"p1": 5, "p4": 9}
    kwargs = dict(kv_cache_memory="120KiB", max_num_seqs=6)
    serial_engine = make_llm(tiny_llama, async_scheduling=False, **kwargs).llm_engine
    serial = run(serial_engine, requests, aborts)
    engine = make_llm(tiny_llama, async_scheduling=True, **kwargs).llm_engine
    ahead = run(engine, requests, aborts)
    stats = engine.stats()
    assert stats.num_preemptions_total > 0
    assert stats.num_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    for rid in requests:
        if rid not in aborts:
            assert ahead[rid] == serial[rid], rid
            assert len(ahead[rid].token_ids) == 60


def test_penalties_and_min_tokens_count_the_token_in_flight(tiny_llama):
    """A step's sampling is queued after the previous step's samples are read, so the
    penalties and min_tokens of a request that ran ahead already count the token that was
    in flight: the replies equal the serial loop's, and they did run ahead."""
    requests = {
        "penalised": ([21, 22, 23], SamplingParams(temperature=0, max_tokens=12,
                                                   ignore_eos=True, frequency_penalty=1.5,
                                                   repetition_penalty=1.3)),
        "plain": ([24, 25], greedy(12)),
    }
    serial = run(make_llm(tiny_llama, async_scheduling=False).llm_engine, requests)
    free = serial["plain"].token_ids
    # min_tokens over a stop token the free reply samples at its third token.
    requests["held"] = ([24, 25], SamplingParams(temperature=0, max_tokens=12, min_tokens=6,
                                                 stop_token_ids=[free[2]]))
    serial = run(make_llm(tiny_llama, async_scheduling=False).llm_engine, requests)
    engine = make_llm(tiny_llama, async_scheduling=True).llm_engine
    on_device = tokens_read_on_the_device(engine)
    assert run(engine, requests) == serial
    assert len(serial["held"].token_ids) >= 6
    assert max(on_device) == 3  # every request's decodes ran ahead


def test_a_grammar_constrained_reply_equals_the_serial_loops(tiny_llama):
    """A grammar's mask for step N+1 is filled after step N's token is accepted."""
    from officellm.engine.structured_output import StructuredOutputsParams

    spec = StructuredOutputsParams(regex=r"(ab|cd)+x")
    requests = {"constrained": ([41, 42, 43], SamplingParams(temperature=0, max_tokens=10,
                                                            structured_outputs=spec)),
                "plain": ([44, 45], greedy(10))}
    serial = run(make_llm(tiny_llama, async_scheduling=False).llm_engine, requests)
    engine = make_llm(tiny_llama, async_scheduling=True).llm_engine
    on_device = tokens_read_on_the_device(engine)
    assert run(engine, requests) == serial
    assert max(on_device) == 2


def test_logprobs_come_back_with_their_tokens(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3)
    outs = {}
    for flag in (False, True):
        engine = make_llm(tiny_llama, async_scheduling=flag).llm_engine
        engine.add_request("x", [31, 32, 33], params, output_kind=OutputKind.FINAL)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outs[flag] = out.outputs[0].logprobs
    assert outs[True] == outs[False] and len(outs[True]) == 5


@pytest.mark.parametrize("kwargs, says", [
    ({"tensor_parallel_size": 2}, "tensor_parallel_size 1"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}, "draft"),
])
def test_async_scheduling_refuses_what_it_cannot_run_ahead_of(kwargs, says):
    with pytest.raises(ValueError, match=says):
        EngineConfig(async_scheduling=True, **kwargs)


def test_async_scheduling_is_on_by_default_only_for_one_cuda_gpu():
    from officellm.engine.engine_core import uses_async_scheduling

    assert uses_async_scheduling(EngineConfig(device="cuda"))
    assert not uses_async_scheduling(EngineConfig(device="cpu"))
    assert not uses_async_scheduling(EngineConfig(device="cuda", tensor_parallel_size=2))
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    assert not uses_async_scheduling(EngineConfig(device="cuda", speculative_config=spec))

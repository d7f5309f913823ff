"""SamplingParams.prompt_logprobs (vLLM's): for each prompt token after the first, its
log-probability given the tokens before it, from the raw distribution, plus the top k; the
first token's entry is None. They must be transformers' float32 log_softmax of the same
logits, however the prompt was run: alone, beside other requests, in chunks, after the
prompt was cached, preempted; and they arrive once, with the request's first output."""

from __future__ import annotations

import pytest
import torch

from officellm.engine import Logprob, SamplingParams, SamplingParamsError
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import Request
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.core.scheduler_output import SamplerOutput
from officellm.engine.frontend.output_processor import OutputKind
from officellm.engine.frontend.outputs import PromptLogprobs
from officellm.engine.frontend.sampling_params import MAX_TOP_LOGPROBS
from officellm.engine.worker.sampler import Sampler
from officellm.engine.worker.sampling_metadata import (
    PromptLogprobRows,
    SamplingMetadata,
    SamplingRow,
)
from tests.engine.conftest import make_llm
from tests.support.hf_reference import load_hf_model
from tests.support.tiny_models import shared_tiny_model

TOLERANCE = 1e-4  # as the sampled logprobs' parity (tests/engine/test_sampling.py)
K = 3


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, smollm2_dir):
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return load_hf_model(tiny_llama)


@pytest.fixture(scope="module")
def prompts(chat_prompt_ids) -> list[list[int]]:
    """Two chat prompts of several blocks each (the prefix cache keeps whole blocks)."""
    long = chat_prompt_ids[5]
    assert len(long) > 40
    return [long, chat_prompt_ids[2]]


def reference(hf, prompt: list[int]) -> torch.Tensor:
    """transformers' float32 log_softmax at positions 0 .. P-2: row i - 1 scores token i."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def assert_matches(entries: PromptLogprobs | None, prompt: list[int], ref: torch.Tensor,
                   k: int = K) -> None:
    """One entry per prompt token, None first; each entry the token's logprob and rank and
    the k best, as transformers has them (ties within TOLERANCE may swap ranks)."""
    assert entries is not None and len(entries) == len(prompt) and entries[0] is None
    for i in range(1, len(prompt)):
        row, entry, token = ref[i - 1], entries[i], prompt[i]
        assert entry is not None
        ours = entry[token].logprob
        assert abs(ours - float(row[token])) < TOLERANCE, (i, ours, float(row[token]))
        above = int((row > ours + TOLERANCE).sum())
        near = int((row >= ours - TOLERANCE).sum())
        assert above + 1 <= entry[token].rank <= near, (i, entry[token].rank, above, near)
        best = row.topk(k).values.tolist()
        top = sorted((lp.rank, t, lp.logprob) for t, lp in entry.items() if lp.rank <= k)
        assert [r for r, _, _ in top] == list(range(1, k + 1))
        for (_, t, lp), expected in zip(top, best):
            assert abs(lp - expected) < TOLERANCE and abs(lp - float(row[t])) < TOLERANCE
        assert set(entry) == {token} | {t for _, t, _ in top}


def scored(max_tokens: int = 2, k: int = K) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                          prompt_logprobs=k)


def test_prompt_logprobs_equal_transformers_log_softmax(tiny_llama, hf, prompts):
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB")
    out = llm.generate(prompts[0], scored())[0]
    assert_matches(out.prompt_logprobs, prompts[0], reference(hf, prompts[0]))


def test_batched_with_a_request_that_does_not_ask(tiny_llama, hf, prompts):
    """Scored beside a prompt that asks for none: each gets what it asked for, and the
    other's tokens are those it gets alone."""
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB")
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    alone = llm.generate(prompts[1], plain)[0].outputs[0].token_ids
    out = llm.generate(prompts, [scored(), plain])
    assert_matches(out[0].prompt_logprobs, prompts[0], reference(hf, prompts[0]))
    assert out[1].prompt_logprobs is None
    assert out[1].outputs[0].token_ids == alone


@pytest.mark.parametrize("settings", [
    {"max_num_batched_tokens": 7},
    {"max_num_batched_tokens": 7, "async_scheduling": True},
], ids=["serial", "async-scheduling"])
def test_chunked_prefill_gathers_every_chunks_positions(tiny_llama, hf, prompts, settings):
    """A prompt run over several steps (decodes and other prompts in them) is scored at
    every position, each once; the step loop may run ahead of the samples it reads."""
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB", **settings)
    out = llm.generate(prompts, [scored(max_tokens=6), scored(max_tokens=6, k=1)])
    assert_matches(out[0].prompt_logprobs, prompts[0], reference(hf, prompts[0]))
    assert_matches(out[1].prompt_logprobs, prompts[1], reference(hf, prompts[1]), k=1)


def test_a_step_scores_at_most_max_num_seqs_positions(tiny_llama, hf, prompts):
    """Every scored position holds a vocabulary-wide row of logits: a step computes no
    more of them than max_num_seqs (the rows the start-up profile sizes the sampler for),
    so the prompt is chunked to that, whatever the token budget."""
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB", max_num_seqs=4)
    steps = llm.llm_engine.engine_core.num_steps_total
    out = llm.generate(prompts[0], scored(max_tokens=1))[0]
    assert llm.llm_engine.engine_core.num_steps_total - steps >= (len(prompts[0]) - 1) / 4
    assert_matches(out.prompt_logprobs, prompts[0], reference(hf, prompts[0]))


def test_a_cached_prompt_is_still_scored_at_every_position(tiny_llama, hf, prompts):
    """The prefix cache holds KV, not logits: a request asking for prompt logprobs computes
    its whole prompt though an earlier request cached it."""
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB", enable_prefix_caching=True)
    plain = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompts[0], plain)
    assert llm.generate(prompts[0], plain)[0].num_cached_tokens > 0  # it is cached
    out = llm.generate(prompts[0], scored())[0]
    assert out.num_cached_tokens == 0
    assert_matches(out.prompt_logprobs, prompts[0], reference(hf, prompts[0]))


def test_top_k_holds_the_k_best_tokens_and_the_prompt_tokens_rank(tiny_llama, hf, prompts):
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB")
    prompt = prompts[1]
    entries = llm.generate(prompt, scored(k=5))[0].prompt_logprobs
    ref = reference(hf, prompt)
    for i in range(1, len(prompt)):
        entry = entries[i]
        best = ref[i - 1].topk(5).indices.tolist()
        ranked = {t: lp.rank for t, lp in entry.items() if lp.rank <= 5}
        assert sorted(ranked.values()) == [1, 2, 3, 4, 5]
        # A tie within the tolerance may swap two of the best; nothing else may differ.
        assert len(set(ranked) & set(best)) >= 4
        # The prompt token, and the five best: one of them, or a sixth entry.
        assert set(entry) == {prompt[i]} | set(ranked)


def test_zero_gives_the_prompt_tokens_alone(tiny_llama, hf, prompts):
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB")
    entries = llm.generate(prompts[1], scored(k=0))[0].prompt_logprobs
    assert all(list(e) == [t] for e, t in zip(entries[1:], prompts[1][1:]))


def stream(engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list]:
    """Run the requests streamed (OutputKind.DELTA); every output each one got."""
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params, output_kind=OutputKind.DELTA)
    outputs: dict[str, list] = {rid: [] for rid in requests}
    for _ in range(2000):  # bounded: a request that never ends fails, not hangs
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            outputs[out.request_id].append(out)
    assert not engine.has_unfinished_requests()
    return outputs


def test_streamed_they_come_once_with_the_first_output(tiny_llama, hf, prompts):
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB", max_num_batched_tokens=16)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=5, n=2, prompt_logprobs=K)
    outputs = stream(llm.llm_engine, {"r": (prompts[0], params)})["r"]
    carrying = [i for i, out in enumerate(outputs) if out.prompt_logprobs is not None]
    assert carrying == [0]
    assert any(c.token_ids for c in outputs[0].outputs)
    assert_matches(outputs[0].prompt_logprobs, prompts[0], reference(hf, prompts[0]))


def test_preemption_neither_resends_nor_changes_them(tiny_llama, hf, chat_prompt_ids):
    """A KV pool too small for every answer: requests are preempted and recomputed, prompt
    included, yet each gets its prompt logprobs once, and right."""
    prompts = chat_prompt_ids[:4]
    from officellm.engine.loading.model_spec import ModelSpec

    per_token = ModelSpec.from_json(tiny_llama / "config.json").kv_bytes_per_token(4)
    blocks = sum(-(-len(p) // 16) for p in prompts) + 1
    llm = make_llm(tiny_llama, kv_cache_memory=blocks * 16 * per_token)
    outputs = stream(llm.llm_engine, {f"r{i}": (p, scored(max_tokens=24))
                                      for i, p in enumerate(prompts)})
    assert llm.llm_engine.stats().num_preemptions_total > 0
    for i, p in enumerate(prompts):
        carrying = [out.prompt_logprobs for out in outputs[f"r{i}"]
                    if out.prompt_logprobs is not None]
        assert len(carrying) == 1
        assert_matches(carrying[0], p, reference(hf, p))


def test_a_one_token_prompt_has_one_none_entry(tiny_llama):
    llm = make_llm(tiny_llama, kv_cache_memory="16MiB")
    assert llm.generate([[42]], scored())[0].prompt_logprobs == [None]


@pytest.mark.parametrize("k", [-1, MAX_TOP_LOGPROBS + 1])
def test_prompt_logprobs_have_the_bounds_of_logprobs(k):
    with pytest.raises(SamplingParamsError) as exc:
        SamplingParams(prompt_logprobs=k)
    assert exc.value.field == "prompt_logprobs"
    assert f"between 0 and {MAX_TOP_LOGPROBS}" in str(exc.value)


def test_the_sampler_scores_prompt_rows_after_the_sampled_rows():
    """The logits' rows past the sampled ones are prompt logprobs' rows: each scored at the
    prompt token that follows its position, and left out of sampling."""
    logits = torch.tensor([[0.0, 0.0, 9.0], [0.0, 5.0, 1.0], [3.0, 1.0, 2.0]])
    sampled = Request("s", [1], SamplingParams(temperature=0))
    rows = PromptLogprobRows("p", next_token_ids=[1, 2], num_top=1)
    out = Sampler()(logits, SamplingMetadata([SamplingRow.of(sampled)], [rows]))
    assert out.token_ids == [2]
    raw = torch.log_softmax(logits, dim=-1)
    (entries,) = out.prompt_logprobs
    assert entries[0] == {1: Logprob(pytest.approx(float(raw[1, 1])), 1)}
    assert entries[1] == {2: Logprob(pytest.approx(float(raw[2, 2])), 2),
                          0: Logprob(pytest.approx(float(raw[2, 0])), 1)}


def test_a_step_of_prompt_rows_alone_samples_nothing():
    """A middle chunk of a scored prompt samples no token: its step has rows to score and
    none to sample."""
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    rows = PromptLogprobRows("p", next_token_ids=[0], num_top=0)
    out = Sampler()(logits, SamplingMetadata([], [rows]))
    assert out.token_ids == [] and out.logprobs == [] and out.invalid == []
    assert out.prompt_logprobs == [[{0: Logprob(pytest.approx(-5.0247, abs=1e-4), 3)}]]


def test_a_recompute_before_the_first_token_scores_only_what_is_missing():
    """Preempted mid-prompt, a request is computed again from its first token, but the
    positions already scored are not scored again: each prompt token's entry is the one
    its first computation gave, in order."""
    kv = KVCacheManager(64, 16, enable_prefix_caching=True)
    sched = Scheduler(kv, max_num_seqs=16, max_num_batched_tokens=8, max_model_len=1000)
    prompt = list(range(100, 120))
    req = Request("r", prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    sched.add_request(req)

    def run(expected: range, sampled: list[int]) -> list:
        so = sched.schedule()
        (chunk,) = so.chunks
        assert chunk.prompt_logprob_positions == expected
        entries = [{prompt[j + 1]: Logprob(-float(j + 1), 1)} for j in expected]
        return sched.update_from_output(
            so, SamplerOutput(sampled, [None] * len(sampled), [False] * len(sampled),
                              [entries] if entries else []), 0.0)

    run(range(0, 8), [])
    sched._preempt(req, "a test")
    run(range(0), [])  # positions 0..7 again: scored already
    run(range(8, 16), [])
    (out,) = run(range(16, 19), [7])  # the last prompt position samples the first token
    assert out.prompt_logprobs == [None] + [{prompt[i]: Logprob(-float(i), 1)}
                                            for i in range(1, 20)]
    assert out.finish_reason == "length" and not sched.has_unfinished_requests()

"""Greedy output of the engine equals transformers' generate on the bundled SmolLM2 (fp32),
under batching, chunked prefill, prefix caching and preemption alike."""

from __future__ import annotations

import logging

from officellm.engine import SamplingParams
from tests.engine.conftest import MAX_NEW, make_llm
from tests.support.hf_reference import assert_all_match, compare_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)


def test_batched_greedy_equals_transformers(smollm2_llm, chat_prompt_ids, smollm2_refs):
    outputs = smollm2_llm.generate(chat_prompt_ids, GREEDY)
    assert_all_match(outputs, smollm2_refs)
    assert any(o.outputs[0].finish_reason == "stop" for o in outputs), "no reply reached EOS"


def test_chat_api_stops_at_end_of_turn(smollm2_llm):
    out = smollm2_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                           SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == 2  # <|im_end|>
    assert "Paris" in out.text and "<|im_end|>" not in out.text


def test_chunked_prefill_equals_transformers(smollm2_dir, chat_prompt_ids, smollm2_refs):
    llm = make_llm(smollm2_dir, max_num_batched_tokens=16)
    outputs = llm.generate(chat_prompt_ids, GREEDY)
    assert_all_match(outputs, smollm2_refs)
    assert llm.llm_engine.engine_core.num_steps_total > sum(len(p) for p in chat_prompt_ids) // 16


def test_prefix_caching_off_equals_transformers(smollm2_dir, chat_prompt_ids, smollm2_refs):
    llm = make_llm(smollm2_dir, enable_prefix_caching=False)
    assert_all_match(llm.generate(chat_prompt_ids, GREEDY), smollm2_refs)
    assert llm.llm_engine.stats().prefix_cache_hits == 0


def test_prefix_cache_hits_give_identical_output(smollm2_llm, chat_prompt_ids, smollm2_refs):
    first = smollm2_llm.generate(chat_prompt_ids, GREEDY)
    hits_before = smollm2_llm.llm_engine.stats().prefix_cache_hits
    second = smollm2_llm.generate(chat_prompt_ids, GREEDY)
    assert smollm2_llm.llm_engine.stats().prefix_cache_hits > hits_before
    assert all(o.num_cached_tokens > 0 for o in second)
    assert_all_match(second, smollm2_refs)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second]


def test_preemption_keeps_output_identical(smollm2_dir, chat_prompt_ids, smollm2_refs, caplog):
    # 24 blocks of 16 tokens: 8 chats of ~100 tokens each cannot all stay resident.
    pool = 24 * 16 * 46080
    llm = make_llm(smollm2_dir, kv_cache_memory=pool, enable_prefix_caching=False)
    with caplog.at_level(logging.WARNING, logger="officellm.engine.scheduler"):
        outputs = llm.generate(chat_prompt_ids, GREEDY)
    assert_all_match(outputs, smollm2_refs)
    assert llm.llm_engine.stats().num_preemptions_total > 0
    warnings = [r for r in caplog.records if "Preempted request" in r.getMessage()]
    assert warnings and warnings[0].levelno == logging.WARNING
    assert "blocks in use" in warnings[0].getMessage()


def test_requests_arriving_at_different_steps(smollm2_llm, chat_prompt_ids, smollm2_refs):
    engine = smollm2_llm.llm_engine
    pending = list(enumerate(chat_prompt_ids))
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:
            i, ids = pending.pop(0)
            engine.add_request(f"late-{i}", ids, GREEDY)
        for out in engine.step():
            for c in out.outputs:
                tokens.setdefault(out.request_id, []).extend(c.token_ids)
                logprobs.setdefault(out.request_id, []).extend(c.logprobs or [])
        step += 1
    for i, ref in enumerate(smollm2_refs):
        compare_greedy(tokens[f"late-{i}"], logprobs[f"late-{i}"], ref)

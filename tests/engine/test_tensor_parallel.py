"""Tensor parallelism on the CPU (gloo): two ranks give the greedy tokens of one process
(fp32, under the near-tie rule of tests/support/hf_reference.py, since the row-parallel
all_reduce sums in another order), for tiny Llama/Qwen2/Qwen3 models and SmolLM2, under
chunked prefill, prefix-cache hits and preemption."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.engine import LLM, SamplingParams
from officellm.engine.kv_plan import make_plan
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.worker.tp_worker import SCRUB
from tests.engine.conftest import POISON, make_llm
from tests.support.hf_reference import compare_greedy_outputs
from tests.support.tiny_models import shared_tiny_model

MAX_NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
CHUNK = {"max_num_batched_tokens": 32}  # every chat prompt is prefilled in several chunks


def assert_same_greedy(tp2: LLM, tp1: LLM, prompts: list[list[int]]) -> None:
    for ours, ref in zip(tp2.generate(prompts, GREEDY), tp1.generate(prompts, GREEDY)):
        compare_greedy_outputs(ours.outputs[0], ref.outputs[0])


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_dir(request, tmp_path_factory, smollm2_dir) -> Path:
    return shared_tiny_model(request.param, tmp_path_factory, smollm2_dir)


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir) -> Iterator[tuple[LLM, LLM]]:
    """(TP=2, TP=1) engines over the same tiny model, chunked prefill, prefix caching on."""
    with make_llm(tiny_dir, kv_cache_memory="8MiB", tensor_parallel_size=2, **CHUNK) as tp2:
        yield tp2, make_llm(tiny_dir, kv_cache_memory="8MiB", **CHUNK)


def test_two_ranks_give_the_tokens_of_one_under_chunked_prefill(tiny_pair, chat_prompt_ids):
    tp2, tp1 = tiny_pair
    prompts = chat_prompt_ids[:4]
    assert all(len(p) > CHUNK["max_num_batched_tokens"] for p in prompts)
    assert_same_greedy(tp2, tp1, prompts)


def test_grammar_masks_on_rank_0_constrain_a_tensor_parallel_engine(tiny_pair, chat_prompt_ids):
    """The workers never see the bitmask: rank 0 applies it to the gathered logits."""
    import re

    from officellm.engine.structured_output import StructuredOutputsParams

    tp2, tp1 = tiny_pair
    pattern = r"[a-z]{3,8}-[0-9]{2}"
    params = SamplingParams(temperature=0, max_tokens=24,
                            structured_outputs=StructuredOutputsParams(regex=pattern))
    ours = [o.outputs[0].text for o in tp2.generate(chat_prompt_ids[:3], params)]
    assert all(re.fullmatch(pattern, t) for t in ours), ours
    assert ours == [o.outputs[0].text for o in tp1.generate(chat_prompt_ids[:3], params)]


def test_two_ranks_give_the_prompt_logprobs_of_one(tiny_pair, chat_prompt_ids):
    """Every rank computes the logits of the scored prompt positions (the LM head's gather
    is a collective); rank 0 scores them."""
    tp2, tp1 = tiny_pair
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    prompts = chat_prompt_ids[:2]
    for ours, ref, prompt in zip(tp2.generate(prompts, params), tp1.generate(prompts, params),
                                 prompts):
        assert len(ours.prompt_logprobs) == len(prompt) and ours.prompt_logprobs[0] is None
        for token, a, b in zip(prompt[1:], ours.prompt_logprobs[1:],
                               ref.prompt_logprobs[1:]):
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)


def test_two_ranks_give_the_tokens_of_one_on_prefix_cache_hits(tiny_pair, chat_prompt_ids):
    tp2, tp1 = tiny_pair
    first = chat_prompt_ids[5]
    assert_same_greedy(tp2, tp1, [first])
    hits = tp2.llm_engine.stats().prefix_cache_hits
    assert_same_greedy(tp2, tp1, [first + [198, 504, 2988, 314]])  # the next turn
    assert tp2.llm_engine.stats().prefix_cache_hits >= hits + len(first) // 16 * 16


def test_two_ranks_give_the_tokens_of_one_under_preemption(tiny_dir, chat_prompt_ids):
    prompts = chat_prompt_ids[:4]
    spec = ModelSpec.from_json(tiny_dir / "config.json")
    # Room for every prompt at admission (plus one block), not for all of them grown by
    # MAX_NEW tokens: the running requests must preempt each other; the same block count
    # on both engines.
    blocks = sum(-(-len(p) // 16) for p in prompts) + 1
    assert blocks < sum(-(-(len(p) + MAX_NEW) // 16) for p in prompts)
    tp1 = make_llm(tiny_dir, kv_cache_memory=blocks * 16 * spec.kv_bytes_per_token(4))
    with make_llm(tiny_dir, kv_cache_memory=blocks * 16 * spec.kv_bytes_per_token(4, 2),
                  tensor_parallel_size=2) as tp2:
        assert tp2.llm_engine.engine_core.kv.pool.num_blocks == blocks
        assert_same_greedy(tp2, tp1, prompts)
        assert tp2.llm_engine.stats().num_preemptions_total > 0


def test_smollm2_on_two_ranks_gives_the_tokens_of_one(smollm2_dir, smollm2_llm, chat_prompt_ids):
    # 3 KV heads over 2 ranks: an uneven split (1 and 2 KV heads, 3 and 6 query heads).
    with make_llm(smollm2_dir, tensor_parallel_size=2) as tp2:
        assert_same_greedy(tp2, smollm2_llm, chat_prompt_ids[:4])


@pytest.mark.parametrize("tiny_dir", ["llama"], indirect=True)
def test_each_rank_holds_its_share_of_the_kv_as_plan_says(tiny_dir, caplog):
    with caplog.at_level(logging.INFO), \
            make_llm(tiny_dir, kv_cache_memory="4MiB", tensor_parallel_size=2) as tp2:
        engine = tp2.llm_engine
    assert "KV cache pool per rank: the minimum over 2 ranks" in caplog.text
    # Each rank holds one of the two KV heads: twice the tokens of one process in the same
    # memory, and the bytes per token of `officellm plan --tensor-parallel-size 2`.
    spec = ModelSpec.from_json(tiny_dir / "config.json")
    plan = make_plan(spec, "tiny", 4 * 1024**2, "fp32", tensor_parallel_size=2)
    assert engine.engine_core.bytes_per_token == plan.bytes_per_token == spec.kv_bytes_per_token(4) // 2
    assert engine.engine_core.kv.pool.num_blocks == 4 * 1024**2 // (plan.bytes_per_token * 16)
    assert f"{plan.bytes_per_token:,} B/token" in caplog.text


def test_a_request_that_fails_on_nan_has_its_blocks_scrubbed_on_every_rank(poisoned_model):
    with make_llm(poisoned_model, kv_cache_memory="4MiB", tensor_parallel_size=2) as tp2:
        engine = tp2.llm_engine
        scrubbed: list[list[int]] = []
        executor = engine.engine_core.executor
        send = executor._send  # what goes to the workers

        def spy(message: tuple) -> None:
            if message[0] == SCRUB:
                scrubbed.append(list(message[1]))
            send(message)

        executor._send = spy
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        engine.add_request("poisoned", [10, POISON, 12, 13], params)
        outputs = engine.step()
        assert "NaN" in (outputs[0].error or "")
        assert len(scrubbed) == 1 and scrubbed[0]  # told to the worker, not only done here
        engine.add_request("after", [20, 21, 22], params)
        while engine.has_unfinished_requests():
            assert all(out.error is None for out in engine.step())


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_two_ranks_split_every_expert_and_give_the_tokens_of_one(kind, tmp_path_factory,
                                                                  smollm2_dir, chat_prompt_ids):
    """A mixture of experts splits each expert's intermediate dimension over the ranks
    (gpt-oss: with its biases added once, its sinks and sliding windows split by head)."""
    model_dir = shared_tiny_model(kind, tmp_path_factory, smollm2_dir)
    prompts = chat_prompt_ids[:3]
    with make_llm(model_dir, kv_cache_memory="8MiB", tensor_parallel_size=2, **CHUNK) as tp2:
        assert_same_greedy(tp2, make_llm(model_dir, kv_cache_memory="8MiB", **CHUNK), prompts)

"""Greedy parity with transformers (float32) for the families added for the models offices
run in 2026: Qwen3-MoE, Mixtral, gpt-oss, Gemma 3, Phi-4-mini and Granite, each a tiny
random-weight model built from a scaled-down copy of the real config (tests/support/
tiny_models.py says which). Each runs alone, batched, chunked, from a prefix-cache hit and
under preemption, with prompts and answers longer than the sliding window (16 tokens) and,
for Phi-4-mini, longer than LongRoPE's original window (64 tokens)."""

from __future__ import annotations

import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.kv_cache_groups import KVCacheGroups
from officellm.engine.kv_plan import kv_block_bytes
from officellm.engine.loading.model_spec import ModelSpec
from tests.engine.conftest import make_llm
from tests.support.hf_reference import compare_greedy, hf_greedy, load_hf_model
from tests.support.tiny_models import NEW_FAMILIES, shared_tiny_model

MAX_NEW = 24
BLOCK = 16


def _prompts(chat_prompt_ids: list[list[int]]) -> list[list[int]]:
    """Four chats, two of them lengthened past 64 tokens (LongRoPE's original window)."""
    prompts = chat_prompt_ids[:4]
    return [ids + ids[: 80 - len(ids)] * 3 if i % 2 else ids for i, ids in enumerate(prompts)]


@pytest.fixture(scope="module", params=NEW_FAMILIES)
def family(request, tmp_path_factory, smollm2_dir, chat_prompt_ids):
    kind = request.param
    model_dir = shared_tiny_model(kind, tmp_path_factory, smollm2_dir)
    hf = load_hf_model(model_dir)
    prompts = _prompts(chat_prompt_ids)
    refs = [hf_greedy(hf, p, MAX_NEW, ignore_eos=True) for p in prompts]
    return kind, model_dir, prompts, refs


PARAMS = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)


def _check(outputs, refs) -> None:
    for out, ref in zip(outputs, refs):
        compare_greedy(out.outputs[0].token_ids, out.outputs[0].logprobs, ref)


def test_each_family_alone_batched_and_from_the_prefix_cache(family):
    kind, model_dir, prompts, refs = family
    llm = make_llm(model_dir, kv_cache_memory="16MiB")
    _check([llm.generate([prompts[1]], PARAMS)[0]], [refs[1]])  # alone
    _check(llm.generate(prompts, PARAMS), refs)  # batched; prompt 1 partly cached
    core = llm.llm_engine.engine_core
    hits = core.kv.prefix_cache_hits
    _check(llm.generate(prompts, PARAMS), refs)  # every prompt's blocks cached
    assert core.kv.prefix_cache_hits > hits
    assert core.kv.pool.num_used_blocks == 0


def test_each_family_under_chunked_prefill(family):
    kind, model_dir, prompts, refs = family
    llm = make_llm(model_dir, kv_cache_memory="16MiB", max_num_batched_tokens=16)
    _check(llm.generate(prompts, PARAMS), refs)


def test_each_family_under_preemption(family):
    kind, model_dir, prompts, refs = family
    spec = ModelSpec.from_json(model_dir / "config.json")
    groups = KVCacheGroups.for_windows(spec.layer_windows)
    # Room for the longest request (in chunks of a block) and a block, not for all of them
    # at once: admitted a chunk at a time, the running requests must preempt each other.
    longest = -(-max(len(p) + MAX_NEW for p in prompts) // BLOCK) * BLOCK
    pool = groups.blocks_held(longest, BLOCK, BLOCK) + 1
    assert pool < sum(groups.blocks_held(len(p) + MAX_NEW, BLOCK) for p in prompts)
    llm = make_llm(model_dir, kv_cache_memory=pool * kv_block_bytes(spec, groups, 4, 0, BLOCK),
                   max_model_len=longest, max_num_batched_tokens=BLOCK)
    _check(llm.generate(prompts, PARAMS), refs)
    assert llm.llm_engine.stats().num_preemptions_total > 0


def test_a_gemma3_image_text_checkpoint_serves_its_language_model(tmp_path_factory, smollm2_dir,
                                                                  chat_prompt_ids, caplog):
    """Gemma 3's 4B/12B/27B ship as image-text models: the engine runs their language model
    (transformers' own text-only generate on the whole model is the reference) and says at
    start-up that the vision tower was skipped."""
    import logging

    from transformers import Gemma3ForConditionalGeneration

    model_dir = shared_tiny_model("gemma3", tmp_path_factory, smollm2_dir)
    hf = Gemma3ForConditionalGeneration.from_pretrained(str(model_dir), dtype="float32").eval()
    prompts = _prompts(chat_prompt_ids)[:2]
    refs = [hf_greedy(hf, p, MAX_NEW, ignore_eos=True) for p in prompts]
    with caplog.at_level(logging.INFO):
        llm = make_llm(model_dir, kv_cache_memory="16MiB")
    assert "tensors of the gemma3 checkpoint's vision tower" in caplog.text
    assert llm.llm_engine.engine_core.spec.model_type == "gemma3_text"
    _check(llm.generate(prompts, PARAMS), refs)

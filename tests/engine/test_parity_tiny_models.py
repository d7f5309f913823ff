"""Greedy parity with transformers for tiny random-weight Llama (llama3 rope scaling),
Qwen2 (q/k/v bias, tied embeddings) and Qwen3 (q/k RMSNorm) models built from configs."""

from __future__ import annotations

import pytest

from officellm.engine import SamplingParams
from officellm.engine.loading.model_loader import eos_token_ids
from officellm.engine.loading.model_spec import ModelSpec
from tests.engine.conftest import make_llm
from tests.support.hf_reference import compare_greedy, hf_greedy, load_hf_model
from tests.support.tiny_models import shared_tiny_model

MAX_NEW = 24


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory, smollm2_dir, chat_prompt_ids):
    kind = request.param
    model_dir = shared_tiny_model(kind, tmp_path_factory, smollm2_dir)
    hf = load_hf_model(model_dir)
    # Prompts longer than the llama3 config's original 128 positions exercise the scaling.
    prompts = [ids + ids[: 150 - len(ids)] if i % 2 else ids for i, ids in enumerate(chat_prompt_ids[:4])]
    refs = [hf_greedy(hf, p, MAX_NEW, ignore_eos=True) for p in prompts]
    return kind, model_dir, prompts, refs


@pytest.mark.parametrize("settings", [
    {},
    {"max_num_batched_tokens": 16},
    {"enable_prefix_caching": False},
], ids=["batched", "chunked-prefill", "no-prefix-cache"])
def test_tiny_model_greedy_equals_transformers(tiny, settings):
    kind, model_dir, prompts, refs = tiny
    llm = make_llm(model_dir, kv_cache_memory="16MiB", **settings)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    outputs = llm.generate(prompts, params)
    for out, ref in zip(outputs, refs):
        compare_greedy(out.outputs[0].token_ids, out.outputs[0].logprobs, ref)


def test_tiny_model_under_preemption(tiny, chat_prompt_ids):
    kind, model_dir, _, _ = tiny
    prompts = chat_prompt_ids[:4]
    hf = load_hf_model(model_dir)
    refs = [hf_greedy(hf, p, MAX_NEW, ignore_eos=True) for p in prompts]
    per_token = ModelSpec.from_json(model_dir / "config.json").kv_bytes_per_token(4)
    # Room for every prompt at admission (plus one block), not for all of them grown by
    # MAX_NEW tokens: the running requests must preempt each other.
    blocks = sum(-(-len(p) // 16) for p in prompts) + 1
    assert blocks < sum(-(-(len(p) + MAX_NEW) // 16) for p in prompts)
    llm = make_llm(model_dir, kv_cache_memory=blocks * 16 * per_token)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    outputs = llm.generate(prompts, params)
    assert llm.llm_engine.stats().num_preemptions_total > 0
    for out, ref in zip(outputs, refs):
        compare_greedy(out.outputs[0].token_ids, out.outputs[0].logprobs, ref)


def test_unsupported_architecture_is_refused_with_the_list(tmp_path):
    import json

    from officellm.engine.loading.model_spec import ModelSpec, UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="qwen3") as exc:
        ModelSpec.from_config_dict({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    assert "GPT2LMHeadModel" in str(exc.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(UnsupportedModelError):
        make_llm(tmp_path)


def test_eos_ids_come_from_generation_config_and_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert 2 in eos_token_ids(smollm2_dir, tok)  # <|im_end|>

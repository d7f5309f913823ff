"""gpt-oss as OpenAI ships it: its experts in MXFP4. The engine keeps them in their blocks
(4.25 bits a weight) and runs them through the MoE kernel; with `--quantization none` it
dequantizes them, and then gives transformers' own greedy tokens on the same checkpoint."""

from __future__ import annotations

import logging

import pytest
import torch

from officellm.engine import SamplingParams
from officellm.kernels.reference import quant_reference
from tests.engine.conftest import make_llm
from tests.support.hf_reference import compare_greedy, compare_greedy_outputs, hf_greedy
from tests.support.tiny_models import mxfp4_checkpoint, shared_tiny_model

MAX_NEW = 16
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def mxfp4_dir(tmp_path_factory, smollm2_dir):
    dense = shared_tiny_model("gpt_oss", tmp_path_factory, smollm2_dir)
    return mxfp4_checkpoint(dense, tmp_path_factory.mktemp("gpt-oss-mxfp4") / "model")


@pytest.fixture(scope="module")
def prompts(chat_prompt_ids):
    return chat_prompt_ids[:3]


def test_dequantized_mxfp4_experts_give_transformers_tokens(mxfp4_dir, prompts):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    hf = AutoModelForCausalLM.from_pretrained(
        str(mxfp4_dir), dtype=torch.float32,
        quantization_config=Mxfp4Config(dequantize=True)).eval()
    refs = [hf_greedy(hf, p, MAX_NEW, ignore_eos=True) for p in prompts]
    llm = make_llm(mxfp4_dir, kv_cache_memory="16MiB", quantization="none")
    assert all(layer.moe.quantized is None for layer in llm.llm_engine.engine_core.model.layers)
    for out, ref in zip(llm.generate(prompts, PARAMS), refs):
        compare_greedy(out.outputs[0].token_ids, out.outputs[0].logprobs, ref)


def test_mxfp4_experts_stay_in_their_blocks_and_run_the_moe_kernel(mxfp4_dir, prompts, caplog):
    with caplog.at_level(logging.INFO):
        blocks = make_llm(mxfp4_dir, kv_cache_memory="16MiB", quantization="auto")
    core = blocks.llm_engine.engine_core
    for layer in core.model.layers:
        experts = layer.moe.quantized
        assert experts is not None and experts.fmt13 == experts.fmt2 == quant_reference.MXFP4
        assert layer.moe.w13.numel() == 0  # never a dense copy
    assert "4 MoE layers' experts in blocks" in caplog.text
    # The torch backend runs the blocks through the reference's matmul: the C++ kernel's
    # tokens, but for genuine float32 near-ties.
    reference = make_llm(mxfp4_dir, kv_cache_memory="16MiB", quantization="auto",
                         attention_backend="torch")
    for ours, ref in zip(blocks.generate(prompts, PARAMS), reference.generate(prompts, PARAMS)):
        compare_greedy_outputs(ours.outputs[0], ref.outputs[0])

"""The whole Triton path inside the engine, on the CPU through Triton's interpreter:
TritonAttention and the Triton ops must give the torch backend's greedy tokens exactly
(fp32), through prefill, chunked prefill, prefix-cache hits and decode, and through the
CUDA-graph runner's padded decode path (run eagerly here), with async scheduling as on a GPU;
and --batch-invariant's replies must not depend on the batch."""

from __future__ import annotations

import random

import pytest

from officellm.engine import LLM, SamplingParams
from officellm.engine.attention.row_attention import RowAttention
from officellm.engine.attention.triton_backend import TritonAttention
from tests.support.tiny_models import shared_tiny_model

MAX_NEW = 4


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory, smollm2_dir):
    # Qwen3 has q/k norms, so the strided [T, H, D] RMSNorm path runs as well. One layer:
    # every kernel runs in each, and the interpreter's cost is per layer (3 took 75 s).
    return shared_tiny_model("qwen3", tmp_path_factory, smollm2_dir, layers=1)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    # 23 tokens: ends mid-block; 16: exactly one block; the third shares the first's prefix.
    first = [rng.randrange(3, 4000) for _ in range(23)]
    return [first, [rng.randrange(3, 4000) for _ in range(16)], first[:17] + [7, 8, 9]]


def _generate(model_dir, prompts, backend, graphs=False, rounds=2, **kwargs):
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory="4MiB",
              attention_backend=backend, **kwargs)
    engine = llm.llm_engine
    if graphs:
        engine.engine_core.runner.capture_decode_graphs(4, engine.max_model_len, use_graphs=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    # Two rounds: the second hits the prefix cache (a chunk after cached blocks).
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    if rounds == 1:
        return engine, first
    second = [o.outputs[0].token_ids for o in llm.generate(prompts[::-1], params)]
    return engine, first + second


@pytest.fixture(scope="module")
def torch_tokens(tiny_qwen3, prompts):
    return _generate(tiny_qwen3, prompts, "torch", max_num_batched_tokens=16)[1]


def test_triton_backend_matches_torch_backend(tiny_qwen3, prompts, torch_tokens):
    engine, tokens = _generate(tiny_qwen3, prompts, "triton", max_num_batched_tokens=16)
    assert isinstance(engine.engine_core.runner.attention, TritonAttention)
    assert engine.engine_core.model.ops.rms_norm.__module__ == "officellm.kernels.triton.norm"
    assert tokens == torch_tokens


@pytest.fixture
def graph_runs(monkeypatch) -> list[int]:
    """The batch size of every step the decode-graph runner runs."""
    from officellm.engine.worker.cuda_graphs import DecodeGraphs

    runs: list[int] = []
    original = DecodeGraphs.run

    def counting_run(self, input_ids, positions, metadata):  # type: ignore[no-untyped-def]
        runs.append(input_ids.shape[0])
        return original(self, input_ids, positions, metadata)

    monkeypatch.setattr(DecodeGraphs, "run", counting_run)
    return runs


def test_padded_decode_graph_path_matches(tiny_qwen3, prompts, torch_tokens, graph_runs):
    """3 decodes padded to a batch of 4: padding rows must neither write nor disturb."""
    _, tokens = _generate(tiny_qwen3, prompts, "triton", graphs=True, rounds=1,
                          max_num_batched_tokens=64)
    assert 3 in graph_runs, "the decode steps did not go through the graph runner"
    assert tokens == torch_tokens[: len(prompts)]


def test_prompt_logprobs_on_the_triton_path_match_the_torch_backend(tiny_qwen3, prompts,
                                                                    graph_runs):
    """Prompt logprobs (SamplingParams.prompt_logprobs) through the Triton kernels, the
    prompts chunked beside decodes and the decode-only steps through the graph runner
    (eagerly): the torch backend's numbers."""
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True,
                            prompt_logprobs=2)

    def scored(backend: str, graphs: bool) -> list:
        # A float32 KV cache on both: the backends' defaults differ under a float32 model,
        # and a 16-bit cache's rounding shows (~1e-3) in every chunk that reads it.
        llm = LLM(str(tiny_qwen3), dtype="float32", kv_cache_dtype="float32",
                  kv_cache_memory="4MiB", attention_backend=backend, max_num_batched_tokens=8)
        if graphs:
            engine = llm.llm_engine
            engine.engine_core.runner.capture_decode_graphs(4, engine.max_model_len,
                                                            use_graphs=False)
        return [o.prompt_logprobs for o in llm.generate(prompts, params)]

    expected = scored("torch", graphs=False)
    got = scored("triton", graphs=True)
    assert graph_runs, "no decode step went through the graph runner"
    for prompt, ours, theirs in zip(prompts, got, expected):
        assert len(ours) == len(theirs) == len(prompt) and ours[0] is theirs[0] is None
        for token, a, b in zip(prompt[1:], ours[1:], theirs[1:]):
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)
            best = [sorted(e.values(), key=lambda lp: lp.rank)[0].logprob for e in (a, b)]
            assert best[0] == pytest.approx(best[1], abs=1e-4)


@pytest.mark.slow  # CI budget: docs/testing.md
def test_async_scheduling_through_the_graph_runner_matches(tiny_qwen3, prompts, torch_tokens,
                                                           graph_runs):
    """The GPU's configuration: async scheduling, the decodes' input tokens gathered from the
    previous step's samples on the device, then the graph runner's static buffers."""
    _, tokens = _generate(tiny_qwen3, prompts, "triton", graphs=True, rounds=1,
                          async_scheduling=True, max_num_batched_tokens=64)
    assert 3 in graph_runs, "the decode steps did not go through the graph runner"
    assert tokens == torch_tokens[: len(prompts)]


def test_batch_invariant_replies_are_bit_identical(tiny_qwen3, prompts):
    """--batch-invariant on the Triton path (the decode kernel with one split for every row,
    the fixed-order matmul): a reply alone, over its cached prefix, in a batch and prefilled
    in other chunks has the same token ids and logprobs (without the mode, the batch's reply
    differs)."""
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=1, ignore_eos=True)
    target = prompts[0] * 2  # 46 tokens: three blocks, the last partial

    def reply(llm, batch, at):
        out = llm.generate(batch, params)[at].outputs[0]
        return out.token_ids, [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)]

    def engine(**kwargs):
        return LLM(str(tiny_qwen3), dtype="float32", kv_cache_memory="4MiB",
                   attention_backend="triton", batch_invariant=True, **kwargs)

    llm = engine()
    assert isinstance(llm.llm_engine.engine_core.runner.attention, RowAttention)
    alone = reply(llm, [target], 0)
    assert reply(llm, [target], 0) == alone  # over its cached prefix
    assert reply(llm, [prompts[1], target, prompts[2]], 1) == alone
    chunked = engine(max_num_batched_tokens=16, enable_prefix_caching=False)
    assert reply(chunked, [target], 0) == alone


@pytest.fixture(scope="module")
def tiny_gpt_oss_mxfp4(tmp_path_factory, smollm2_dir):
    """gpt-oss as shipped, two layers (a sliding one with sinks, a full one), its experts in
    MXFP4: the fused MoE kernel reads their blocks."""
    from tests.support.tiny_models import build_tiny_model, mxfp4_checkpoint

    dense = build_tiny_model("gpt_oss", tmp_path_factory.mktemp("gpt-oss-2l") / "dense",
                             smollm2_dir, overrides={
                                 "num_hidden_layers": 2,
                                 "layer_types": ["sliding_attention", "full_attention"]})
    return mxfp4_checkpoint(dense, dense.parent / "mxfp4")


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory, smollm2_dir):
    """Gemma 3, two layers: a sliding one (its own rope) and a global one; GeGLU."""
    from tests.support.tiny_models import build_tiny_model

    return build_tiny_model("gemma3_text", tmp_path_factory.mktemp("gemma3-2l") / "model",
                            smollm2_dir, overrides={
                                "num_hidden_layers": 2,
                                "layer_types": ["sliding_attention", "full_attention"]})


@pytest.mark.parametrize("family", ["tiny_gpt_oss_mxfp4", "tiny_gemma3"])
def test_triton_backend_runs_the_new_families_as_torch_does(family, request, prompts):
    """Sliding windows past their length, sinks, MXFP4 experts through the fused MoE,
    GeGLU and Gemma's sandwich norms: the Triton path's tokens are the torch backend's."""
    model_dir = request.getfixturevalue(family)
    _, torch_tokens = _generate(model_dir, prompts, "torch", rounds=1, quantization="auto")
    engine, tokens = _generate(model_dir, prompts, "triton", rounds=1, quantization="auto")
    if family == "tiny_gpt_oss_mxfp4":
        from officellm.kernels.reference.quant_reference import MXFP4

        assert all(layer.moe.quantized.fmt13 == MXFP4
                   for layer in engine.engine_core.model.layers)
    assert tokens == torch_tokens

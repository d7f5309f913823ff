"""Weights kept in blocks (`--quantization`): the GGUF's own blocks (Q8_0, Q4_0, Q4_1 and
the K-quants Q4_K, Q6_K), or a safetensors model's quantized at load, run by the C++ kernel;
the greedy output equals the engine's torch reference of the same blocks token for token
(and logprob for logprob)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from officellm.engine import SamplingParams
from officellm.engine.loading.gguf_tensors import QuantizedTensor, read_quantized
from officellm.engine.loading.model_loader import bundled_model_path, iter_weights
from officellm.engine.models.parallel_linear import ColumnParallelLinear
from officellm.engine.models.quantized_linear import QuantizedWeight
from officellm.engine.precision.weight_quantization import gguf_blocks, resolve_quantization
from officellm.engine.worker import quantization_choice
from officellm.engine.worker.quantization_choice import MatmulPair, MatmulTiming, blocks_max_rows
from officellm.kernels.reference import quant_reference
from tests.engine.conftest import make_llm

GREEDY = SamplingParams(temperature=0, max_tokens=24, logprobs=2)


def _quantized_weights(llm) -> list[QuantizedWeight]:
    model = llm.llm_engine.engine_core.model
    modules = [model.embed, model.lm_head, *(m for layer in model.layers for m in (
        layer.qkv, layer.o_proj, layer.gate_up, layer.down))]
    return [m.quantized for m in modules if m.quantized is not None]


def _greedy(llm, prompts) -> list[tuple[list[int], list[dict]]]:
    out = llm.generate(prompts, GREEDY)
    return [(o.outputs[0].token_ids,
             [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs])
            for o in out]


def _with_reference_matmul(llm):
    """Swap the kernel for its torch reference in every blocked matmul (nothing else)."""
    for weight in _quantized_weights(llm):
        weight.matmul = quant_reference.quant_matmul


@pytest.fixture(scope="module")
def gguf_llm(smollm2_dir):
    return make_llm(smollm2_dir, quantization="gguf")


@pytest.fixture(scope="module")
def k_quant_gguf(tmp_path_factory) -> Path:
    """A 2-layer Llama in the usual download's mix of Q4_K and Q6_K (and one Q8_0)."""
    from tests.support.k_quant_gguf import write_k_quant_gguf

    return write_k_quant_gguf(tmp_path_factory.mktemp("kquant") / "kquant.gguf",
                              bundled_model_path())


def test_the_gguf_blocks_dequantize_to_the_converted_checkpoint(smollm2_dir):
    """Our reader (names, q/k row order, blocks) against the file dequantized by gguf-py."""
    spec_heads = (9, 3)  # SmolLM2-135M: 9 query heads, 3 KV heads
    blocks = read_quantized(bundled_model_path(), *spec_heads)
    assert len(blocks.tensors) == 30 * 7 + 1 and not blocks.unsupported
    dense = dict(iter_weights(smollm2_dir))
    for name, q in blocks.tensors.items():
        assert torch.equal(quant_reference.dequantize(q.data, q.fmt), dense[name]), name


def test_k_quant_blocks_dequantize_as_transformers_converts_them(k_quant_gguf):
    """Q4_K and Q6_K read by our reader and reference, against transformers' (gguf-py's)
    dequantization of the same file."""
    from officellm.engine.loading.model_loader import resolve_model_dir
    from tests.support.k_quant_gguf import HEADS, KV_HEADS

    blocks = read_quantized(k_quant_gguf, HEADS, KV_HEADS)
    assert not blocks.unsupported
    assert {q.fmt for q in blocks.tensors.values()} == {
        quant_reference.Q4_K, quant_reference.Q6_K, quant_reference.Q8_0}
    dense = dict(iter_weights(resolve_model_dir(k_quant_gguf)))
    assert len(blocks.tensors) == 2 * 7 + 1
    for name, q in blocks.tensors.items():
        assert torch.equal(quant_reference.dequantize(q.data, q.fmt), dense[name]), name


def test_greedy_over_k_quant_blocks_equals_the_torch_reference_token_for_token(k_quant_gguf):
    """Every matmul of the K-quant file in its blocks (a fused q/k/v of three types), four
    prompts batched under chunked prefill, the kernel against its reference."""
    settings = dict(quantization="gguf", max_num_batched_tokens=64)
    ours = make_llm(k_quant_gguf, **settings)
    weights = _quantized_weights(ours)
    assert len(weights) == 2 * 4 + 2  # the tied head reads the embedding's Q6_K blocks
    assert {g.fmt for w in weights for g in w.groups} == {
        quant_reference.Q4_K, quant_reference.Q6_K, quant_reference.Q8_0}
    reference = make_llm(k_quant_gguf, **settings)
    _with_reference_matmul(reference)
    prompts = [[1, 400, 500, 600, 700] * 10, [1, 42, 43], [5, 6, 7, 8, 9, 10, 11] * 5, [100]]
    assert _greedy(ours, prompts) == _greedy(reference, prompts)


def test_every_matmul_of_the_bundled_model_reads_blocks(gguf_llm):
    model = gguf_llm.llm_engine.engine_core.model
    assert all(m.quantized is not None for layer in model.layers
               for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
    assert model.lm_head.quantized is not None and model.embed.quantized is not None
    assert model.layers[0].qkv.weight.numel() == 0  # the dense copy is released


def test_weights_only_blocks_serve_are_not_dequantized_at_load(smollm2_dir, monkeypatch):
    """With every matmul in blocks, loading dequantizes the norms only: reading and
    dequantizing the matrices blocks serve was most of an 8B GGUF's 92 s load."""
    from officellm.engine.loading import gguf_checkpoint

    read: list[tuple[str, int]] = []
    dequantized = gguf_checkpoint.dequantized

    def spy(layout, info):
        read.append((info.name, len(info.shape)))
        return dequantized(layout, info)

    monkeypatch.setattr(gguf_checkpoint, "dequantized", spy)
    make_llm(smollm2_dir, quantization="gguf")
    assert read and all(dims == 1 for _, dims in read), [n for n, d in read if d > 1]


def test_auto_keeps_no_dense_copy_that_would_not_fit_in_memory(smollm2_dir, monkeypatch,
                                                               caplog):
    """An 8B GGUF's bf16 dense copy (14 GiB) beside its blocks was killed for memory on a
    23 GiB desktop: where the copy would take over half the memory available, auto serves
    every batch from blocks without measuring, and says why."""
    from officellm.engine.worker import worker

    room = 100 * 2**20  # the bundled model's dense matmuls alone are ~500 MiB in float32
    monkeypatch.setattr(worker, "available_memory_bytes", lambda: room)
    monkeypatch.setattr(worker, "remembered_reach", lambda *a, **k: pytest.fail("measured"))
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = make_llm(smollm2_dir, quantization="auto")
    model = llm.llm_engine.engine_core.model
    assert all(w.max_rows is None for w in _quantized_weights(llm))
    assert model.layers[0].qkv.weight.numel() == 0
    assert any("would take" in r.getMessage() for r in caplog.records)


def test_auto_keeps_the_dense_copy_it_measured_faster_for_large_batches(smollm2_dir,
                                                                        monkeypatch):
    from officellm.engine.worker import worker

    monkeypatch.setattr(worker, "remembered_reach", lambda *a, **k: 8)
    llm = make_llm(smollm2_dir, quantization="auto")
    model = llm.llm_engine.engine_core.model
    qkv = model.layers[0].qkv
    assert qkv.quantized is not None and qkv.quantized.max_rows == 8
    spec = model.spec
    blocks = read_quantized(bundled_model_path(), spec.num_heads, spec.num_kv_heads).tensors
    parts = [blocks[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    dense = torch.cat([quant_reference.dequantize(t.data, t.fmt) for t in parts])
    torch.testing.assert_close(qkv.weight, dense, rtol=0, atol=0)  # loaded beside the blocks


def test_weights_in_blocks_take_about_the_file_size(gguf_llm):
    engine = gguf_llm.llm_engine.engine_core
    file_size = bundled_model_path().stat().st_size
    assert engine.model.weight_bytes() <= 1.05 * file_size


def test_greedy_over_blocks_equals_the_torch_reference_token_for_token(
        smollm2_dir, chat_prompt_ids):
    """The kernel and its reference perform the same float operations: the same tokens and
    the same logprobs, four prompts batched under chunked prefill. (The same engine settings
    on both sides: int8 rounding of the activations turns the last-bit differences that a
    change of batch makes in the other kernels into visible ones, as in llama.cpp.)"""
    settings = dict(quantization="gguf", max_num_batched_tokens=64)
    ours = make_llm(smollm2_dir, **settings)
    reference = make_llm(smollm2_dir, **settings)
    _with_reference_matmul(reference)
    prompts = chat_prompt_ids[:4]
    assert _greedy(ours, prompts) == _greedy(reference, prompts)


@pytest.mark.parametrize("method,fmt", [("int8", quant_reference.Q8_0),
                                        ("int4", quant_reference.Q4_1)])
def test_a_safetensors_model_is_quantized_at_load(tmp_path_factory, smollm2_dir, method, fmt):
    from tests.support.tiny_models import shared_tiny_model

    model_dir = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    llm = make_llm(model_dir, quantization=method)
    weights = _quantized_weights(llm)
    # 3 layers x 4 matmuls, the untied head and the embedding table.
    assert len(weights) == 3 * 4 + 2 and {g.fmt for w in weights for g in w.groups} == {fmt}
    reference = make_llm(model_dir, quantization=method)
    _with_reference_matmul(reference)
    prompts = [[1, 400, 500, 600, 700], [1, 42, 43]]
    assert _greedy(llm, prompts) == _greedy(reference, prompts)


def test_none_keeps_every_weight_dense(smollm2_dir):
    llm = make_llm(smollm2_dir, quantization="none")
    assert _quantized_weights(llm) == []


@pytest.mark.parametrize("requested,gguf,backend,world,reason", [
    ("gguf", None, "cpu", 1, "applies to a .gguf model"),
    ("int8", Path("m.gguf"), "cpu", 1, "already quantized"),
    ("int4", None, "triton", 1, "runs on the CPU"),
    ("gguf", Path("m.gguf"), "cpu", 2, "with one rank"),
])
def test_a_quantization_that_does_not_apply_is_refused_saying_why(requested, gguf, backend,
                                                                  world, reason):
    with pytest.raises(ValueError, match=reason):
        resolve_quantization(requested, gguf, backend, world)


@pytest.mark.parametrize("gguf,backend,world,expected", [
    (Path("m.gguf"), "cpu", 1, "gguf"), (None, "cpu", 1, "none"),
    (Path("m.gguf"), "triton", 1, "none"), (Path("m.gguf"), "cpu", 2, "none")])
def test_auto_considers_blocks_only_for_a_gguf_on_one_cpu_rank(gguf, backend, world, expected):
    assert resolve_quantization("auto", gguf, backend, world) == expected


MIB = 1024**2


# (rows, dense ms, blocks ms) as auto measures them, fewest rows first.
@pytest.mark.parametrize("timings,expected", [
    # Blocks win small batches and tie the rest: blocks for every batch, dense released.
    (((1, 3.1, 1.2), (16, 11.0, 11.0), (64, 40.0, 41.0)), None),
    # AVX2 float32 on a small model: blocks win up to 8 rows, dense wins from 16.
    (((1, 3.1, 1.2), (4, 3.5, 1.9), (8, 4.0, 3.0), (16, 0.39, 0.58)), 8),
    # A loss in the middle ends the reach there, whatever larger sizes show.
    (((1, 3.0, 1.0), (4, 3.0, 4.0), (16, 10.0, 5.0)), 1),
    # AVX-512 BF16: tied at one row, packed bf16 8x faster at 16.
    (((1, 1.28, 1.27), (16, 1.35, 11.1)), 0),
    # Within 10% everywhere: the exact dense path stays.
    (((1, 1.0, 0.95), (16, 10.0, 9.5)), 0),
])
def test_auto_runs_blocks_up_to_the_largest_batch_where_they_clearly_win(timings, expected):
    assert blocks_max_rows(MatmulTiming(*t) for t in timings) == expected


def test_auto_measures_as_many_layers_as_outgrow_twice_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(quantization_choice, "last_level_cache_bytes", lambda: 16 * MIB)
    pairs = [MatmulPair(32, torch.nn.Identity(), torch.nn.Identity(), 10 * MIB)
             for _ in range(10)]
    assert len(quantization_choice.measured_pairs(iter(pairs))) == 4  # 40 MiB > 2 x 16
    assert len(quantization_choice.measured_pairs(iter(pairs[:2]))) == 2  # all there are


def test_a_weight_kept_both_ways_runs_blocks_up_to_its_batch_size_and_dense_above():
    torch.manual_seed(0)
    layer = ColumnParallelLinear(64, 8, bias=False, dtype=torch.float32)
    layer.weight.data = torch.randn(8, 64)
    other = torch.randn(8, 64)  # the blocks hold another matrix, to tell the two apart
    blocks = QuantizedTensor(quant_reference.Q8_0, quant_reference.quantize_q8_0(other), 64)
    layer.quantized = QuantizedWeight.fuse([blocks], quant_reference.quant_matmul, max_rows=2)
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x[:2]), quant_reference.quant_matmul(
        x[:2], blocks.data, blocks.fmt), rtol=0, atol=0)
    torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=0, atol=0)


def test_an_unknown_quantization_is_refused_with_the_choices():
    from officellm.engine.config import EngineConfig

    with pytest.raises(ValueError, match="auto, gguf, int8, int4, none"):
        EngineConfig(quantization="awq")


def test_a_gguf_type_without_a_kernel_is_dequantized_with_one_warning(tmp_path, caplog):
    import gguf
    from gguf import GGMLQuantizationType as T

    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 176), dtype=np.uint8),
                      raw_dtype=T.Q5_K)
    writer.add_tensor("blk.0.attn_v.weight", np.zeros((4, 176), dtype=np.uint8),
                      raw_dtype=T.Q5_K)
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((4, 20), dtype=np.uint8),
                      raw_dtype=T.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with caplog.at_level(logging.WARNING, logger="officellm.engine.precision.weight_quantization"):
        blocks = gguf_blocks(path, 2, 2)
    assert list(blocks.tensors) == ["model.layers.0.self_attn.k_proj.weight"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Q5_K" in warnings[0] and "2 tensor(s)" in warnings[0]


def test_auto_keeps_a_models_first_choice_on_this_machine(tmp_path) -> None:
    """A restart, a wake from idle sleep or a reload in the model pool gets the weights the
    model got at its first start: the timing is not drawn again near its margin."""
    calls: list[str] = []

    def measure(answer: int | None) -> Callable[[], int | None]:
        return lambda: calls.append("measured") or answer

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    reach = quantization_choice.remembered_reach
    first = reach(str(source), torch.float32, False, measure(8), tmp_path)
    again = reach(str(source), torch.float32, False, measure(0), tmp_path)
    other = reach(str(source), torch.bfloat16, False, measure(0), tmp_path)
    assert (first, again, other) == (8, 8, 0)
    assert calls == ["measured", "measured"]
    source.write_bytes(b"GGUF, another file")  # a new file is measured afresh
    assert reach(str(source), torch.float32, False, measure(16), tmp_path) == 16

"""Every attention backend reads the one metadata format (block tables) and agrees with the
reference, and ModelRunner builds that metadata as the backends expect."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from officellm.engine.attention import selection
from officellm.engine.attention.backend import (
    AttentionMetadata,
    LayerAttention,
    uniform_layers,
)
from officellm.engine.attention.cpu_backend import CHUNK_KERNEL_MAX_ROWS
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.worker.model_runner import ModelRunner, StepBatch
from officellm.engine.worker.sampling_metadata import SamplingMetadata
from officellm.kernels.reference import reference
from officellm.kernels.reference.paged_problems import (
    PagedProblem,
    hidden_by_window,
    make_problem,
    reference_output,
    stored_as,
)
from tests.kernels.conftest import DTYPES, close

# Decodes first (one past a block boundary, exact boundary, a first token), then a fresh
# prefill, chunks after a cached prefix, a one-token chunk that must run as a prefill, and a
# chunk longer than the CPU backend's chunk kernel takes (it goes to SDPA).
MIXED = [(17, 1), (32, 1), (1, 1), (21, 21), (37, 11), (30, 1), (48, 16), (90, 40)]
DECODES = [(17, 1), (1, 1), (45, 1), (300, 1)]


def metadata_for(p: PagedProblem) -> AttentionMetadata:
    """The metadata ModelRunner would build for this problem: its new tokens are the tail
    of each sequence, at the slots their block tables give."""
    qsl, lens = p.query_start_loc.tolist(), p.seq_lens.tolist()
    q_lens = [e - s for s, e in zip(qsl, qsl[1:])]
    bs = p.k_cache.shape[1]
    slots = []
    for b, (n, ctx) in enumerate(zip(q_lens, lens)):
        pos = torch.arange(ctx - n, ctx)
        slots.append(p.block_tables[b].cpu()[pos // bs] * bs + pos % bs)
    num_decodes = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
    return AttentionMetadata(  # one KV cache group
        slot_mapping=torch.cat(slots).to(p.q.device).unsqueeze(0),
        block_tables=p.block_tables.unsqueeze(0), seq_lens=p.seq_lens,
        query_start_loc=p.query_start_loc,
        num_decodes=num_decodes, max_query_len=max(q_lens), seq_lens_host=lens,
        query_start_loc_host=qsl)


def run_backend(name: str, p: PagedProblem,
                layer: LayerAttention = LayerAttention()) -> torch.Tensor:
    """One layer's forward through the named backend. The step's k/v are read back from the
    cache and the rotary is the identity (cos 1, sin 0), so writing them is a no-op and the
    reference sees the same cache and queries."""
    md = metadata_for(p)
    hk = p.k_cache.shape[2]
    # In the query's dtype, as the model hands them over: what the cache holds, so storing
    # them again changes nothing (an fp8 value round-trips exactly; an int8 row requantizes
    # to the same integers and a scale within an ulp).
    d = p.q.shape[-1]
    slots = md.slot_mapping[0]
    k = reference.read_cache_rows(p.k_cache.view(-1, hk, p.k_cache.shape[-1])[slots],
                                  d, p.q.dtype)
    v = reference.read_cache_rows(p.v_cache.view(-1, hk, p.v_cache.shape[-1])[slots],
                                  d, p.q.dtype)
    backend = selection.attention_for(p.q.device, [p.k_cache], [p.v_cache], p.scale, name,
                                      layers=[layer])
    backend.set_metadata(md)
    cos = torch.ones(p.q.shape[0], d, device=p.q.device)
    return backend.forward(0, p.q, k, v, cos, torch.zeros_like(cos))


def _cases(name: str) -> list[torch.dtype]:
    if name == "triton":
        return DTYPES  # the interpreter's half precision is float16 only
    return [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("name,dtype", [(n, dt) for n in ("torch", "cpu", "triton")
                                        for dt in _cases(n)])
@pytest.mark.parametrize("seqs", [MIXED, DECODES], ids=["mixed", "decodes"])
@pytest.mark.parametrize("hq,hk,head_dim", [(9, 3, 64), (4, 1, 32)])
def test_backend_matches_reference(name, dtype, seqs, hq, hk, head_dim):
    p = make_problem(seqs, hq, hk, head_dim, dtype, torch.device("cpu"), seed=11)
    close(run_backend(name, p), reference_output(p), dtype)


@pytest.mark.parametrize("name,dtype", [(n, dt) for n in ("torch", "cpu", "triton")
                                        for dt in _cases(n)])
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8],
                         ids=["e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("seqs", [MIXED, DECODES], ids=["mixed", "decodes"])
def test_backend_reads_a_one_byte_cache(name, dtype, cache_dtype, seqs):
    """--kv-cache-dtype fp8_*/int8: every backend, decodes and prefills, equals the
    reference over the values the one-byte cache holds."""
    p = make_problem(seqs, 9, 3, 64, dtype, torch.device("cpu"), seed=11)
    stored, rounded = stored_as(p, cache_dtype)
    close(run_backend(name, stored), reference_output(rounded), dtype)


@pytest.mark.parametrize("name", ["torch", "cpu", "triton"])
@pytest.mark.parametrize("window,with_sinks", [(10, False), (None, True), (24, True)],
                         ids=["window", "sinks", "window+sinks"])
@pytest.mark.parametrize("seqs", [MIXED, DECODES], ids=["mixed", "decodes"])
def test_backend_applies_the_layers_window_and_sinks(name, window, with_sinks, seqs):
    """A sliding-window layer (the blocks before its window the null block, filled with NaN:
    a backend that read them would say so) and a layer with sinks, through every backend,
    equal the reference."""
    p = make_problem(seqs, 8, 2, 32, torch.float32, torch.device("cpu"), seed=5)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(6)) if with_sinks else None
    run_on = hidden_by_window(p, window) if window is not None else p
    if name == "torch" and window is not None:
        # The torch backend gathers a batch's blocks up to its longest row, so a shorter
        # row's padding reads the null block: zero in the engine (ModelRunner), so here too.
        run_on.k_cache[-1] = 0
        run_on.v_cache[-1] = 0
    out = run_backend(name, run_on, LayerAttention(0, window, sinks))
    close(out, reference_output(p, window, sinks), torch.float32)


@pytest.mark.parametrize("name", ["torch", "cpu", "triton"])
def test_backend_rotates_q_and_k_then_stores_and_attends(name):
    """The backend takes q/k before the rotary: its cache and output are the reference's
    rotary, KV write and attention."""
    p = make_problem(MIXED[:5], 4, 2, 32, torch.float32, torch.device("cpu"), seed=3)
    md = metadata_for(p)
    t, hk, d = p.q.shape[0], p.k_cache.shape[2], p.q.shape[2]
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(2, t, hk, d, generator=g)
    cos, sin = torch.randn(2, t, d, generator=g)
    q_rot, k_rot = reference.apply_rotary(p.q, k, cos, sin)
    want = dataclasses.replace(p, q=q_rot, k_cache=p.k_cache.clone(), v_cache=p.v_cache.clone())
    reference.write_kv_cache(k_rot, v, want.k_cache, want.v_cache, md.slot_mapping[0])
    backend = selection.attention_for(p.q.device, [p.k_cache], [p.v_cache], p.scale, name)
    backend.set_metadata(md)
    out = backend.forward(0, p.q, k, v, cos, sin)
    close(p.k_cache, want.k_cache, torch.float32)
    assert torch.equal(p.v_cache, want.v_cache)
    close(out, reference_output(want), torch.float32)


def _runner(block_size: int = 4, num_blocks: int = 10) -> ModelRunner:
    spec = ModelSpec.from_config_dict({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 50, "max_position_embeddings": 64})
    model = SimpleNamespace(plan=SimpleNamespace(num_kv_heads=2), rotary_long_offset=0,
                            attention_layers=lambda groups: uniform_layers(1))
    return ModelRunner(model, spec, num_blocks, block_size, torch.float32,
                       torch.device("cpu"), attention_backend="torch")


def test_runner_builds_one_block_table_format():
    runner = _runner()
    # Two decodes, a chunk after 3 cached tokens, then a one-token prompt tail (a prefill).
    batch = StepBatch(
        token_ids=np.arange(8), positions=np.array([9, 2, 3, 4, 5, 6, 7, 0]),
        slot_mapping=np.arange(8)[None], query_lens=[1, 1, 5, 1], context_lens=[10, 3, 8, 1],
        block_tables=[[[4, 5, 6], [1], [2, 3], [7]]], logits_indices=[0, 1, 6, 7])
    md = runner.inputs_for(batch, SamplingMetadata()).metadata
    null = runner.null_block
    assert md.block_tables.dtype == torch.int64
    assert md.block_tables.tolist() == [[[4, 5, 6], [1, null, null], [2, 3, null],
                                         [7, null, null]]]
    assert md.seq_lens.dtype == torch.int32 and md.seq_lens.tolist() == [10, 3, 8, 1]
    assert md.query_start_loc.dtype == torch.int32
    assert md.query_start_loc.tolist() == md.query_start_loc_host == [0, 1, 2, 7, 8]
    assert md.seq_lens_host == [10, 3, 8, 1]
    assert md.num_decodes == 2 and md.max_query_len == 5 and md.num_seqs == 4
    assert md.slot_mapping.tolist() == [list(range(8))]
    decodes_only = StepBatch(
        token_ids=np.arange(2), positions=np.array([9, 2]), slot_mapping=np.arange(2)[None],
        query_lens=[1, 1], context_lens=[10, 3], block_tables=[[[4, 5, 6], [1]]],
        logits_indices=[0, 1])
    md = runner.inputs_for(decodes_only, SamplingMetadata()).metadata
    assert md.num_decodes == 2 and md.max_query_len == 1


def test_a_steps_integer_inputs_reach_the_device_in_one_copy():
    """Token ids, positions, sampled rows, slots, lengths and block tables are staged in one
    host buffer: on a GPU one asynchronous copy a step, not seven host-waiting ones."""
    runner = _runner()
    batch = StepBatch(
        token_ids=np.arange(6), positions=np.array([9, 2, 3, 4, 5, 6]),
        slot_mapping=np.arange(6)[None] + 20, query_lens=[1, 1, 4], context_lens=[10, 3, 7],
        block_tables=[[[4, 5, 6], [1], [2, 3]]], logits_indices=[0, 1, 5])
    inputs = runner.inputs_for(batch, SamplingMetadata())
    md = inputs.metadata
    staged = [inputs.input_ids, inputs.positions, inputs.logits_indices, md.slot_mapping,
              md.block_tables]
    assert len({t.untyped_storage().data_ptr() for t in staged}) == 1
    assert inputs.input_ids.tolist() == list(range(6))
    assert inputs.positions.tolist() == [9, 2, 3, 4, 5, 6]
    assert inputs.logits_indices.tolist() == [0, 1, 5]
    assert md.slot_mapping.tolist() == [list(range(20, 26))]


def test_mixed_batch_takes_both_cpu_prefill_paths():
    """The mixed batch must keep a cached-history chunk on each side of the CPU backend's
    chunk-kernel limit, or the backend test above stops covering one of them."""
    cached = [q for ctx, q in MIXED if 1 < q < ctx]
    assert any(q <= CHUNK_KERNEL_MAX_ROWS for q in cached)
    assert any(q > CHUNK_KERNEL_MAX_ROWS for q in cached)

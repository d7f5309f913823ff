"""How a model splits over tensor-parallel ranks: heads by KV head, MLP and vocabulary by
range; impossible splits are refused before any process starts."""

from __future__ import annotations

import pytest
import torch

from officellm.engine.kv_plan import load_spec
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.shard_plan import ShardPlan, TensorParallelSplitError


def spec(heads: int, kv_heads: int, vocab: int = 100, intermediate: int = 64) -> ModelSpec:
    return ModelSpec.from_config_dict({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": heads * 8,
        "intermediate_size": intermediate, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab})


def test_query_heads_follow_their_kv_heads_to_a_rank():
    plans = [ShardPlan.for_rank(spec(8, 2), r, 2) for r in range(2)]
    assert [(p.q_heads, p.kv_heads) for p in plans] == [
        (range(0, 4), range(0, 1)), (range(4, 8), range(1, 2))]


def test_uneven_kv_heads_split_unevenly_as_in_smollm2():
    smollm2, _ = load_spec("SmolLM2-135M-Instruct")  # 9 query heads over 3 KV heads
    plans = [ShardPlan.for_rank(smollm2, r, 2) for r in range(2)]
    assert [p.num_kv_heads for p in plans] == [1, 2]
    assert [p.num_q_heads for p in plans] == [3, 6]
    # The pool is sized for the largest share, as `plan` and the start-up lines count it.
    assert smollm2.kv_bytes_per_token(2, 2) == 2 * 30 * 2 * 64 * 2


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    plans = [ShardPlan.for_rank(spec(8, 2), r, 4) for r in range(4)]
    assert [p.kv_heads for p in plans] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [p.q_heads for p in plans] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


def test_a_split_that_breaks_a_query_group_is_refused():
    with pytest.raises(TensorParallelSplitError, match="Cannot split 8 attention heads"):
        ShardPlan.for_rank(spec(8, 2), 0, 3)


def test_the_vocabulary_splits_into_padded_equal_shards():
    plans = [ShardPlan.for_rank(spec(8, 2, vocab=101), r, 2) for r in range(2)]
    assert [p.vocab for p in plans] == [range(0, 51), range(51, 101)]
    embed = torch.arange(101 * 3, dtype=torch.float32).view(101, 3)
    last = plans[1].shard("embed_tokens.weight", embed)
    assert last.shape == (51, 3)
    assert torch.equal(last[:50], embed[51:]) and not last[50].any()


def test_fused_and_row_parallel_weights_are_cut_where_their_heads_are():
    plan = ShardPlan.for_rank(spec(8, 2), 1, 2)  # q heads 4..7, kv head 1, head_dim 8
    q = torch.arange(64 * 64, dtype=torch.float32).view(64, 64)
    assert torch.equal(plan.shard("self_attn.q_proj.weight", q), q[32:64])
    k = torch.arange(16 * 64, dtype=torch.float32).view(16, 64)
    assert torch.equal(plan.shard("self_attn.k_proj.weight", k), k[8:16])
    assert torch.equal(plan.shard("self_attn.o_proj.weight", q), q[:, 32:64])
    bias = torch.arange(64, dtype=torch.float32)
    assert torch.equal(plan.shard("self_attn.o_proj.bias", bias), bias)  # added once, whole
    norm = torch.ones(8)
    assert plan.shard("self_attn.q_norm.weight", norm) is norm  # per head_dim, every head

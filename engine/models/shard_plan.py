"""Which slice of every weight one tensor-parallel rank holds.

Attention is split by KV head, each rank taking its KV heads and the query heads that
attend to them, so grouped-query attention needs no communication. With fewer KV heads
than ranks, KV heads are replicated: query heads split evenly and rank r uses KV head
r * num_kv_heads // tp. The MLP's intermediate dimension, and the vocabulary of the
embedding and LM head, split into contiguous ranges. Splits need not be even (SmolLM2 has
3 KV heads): a rank's KV pool is sized for the largest share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from officellm.engine.loading.model_spec import ModelSpec


class TensorParallelSplitError(ValueError):
    """The model's heads cannot be split over this many ranks."""


def _even_range(n: int, rank: int, world_size: int) -> range:
    return range(rank * n // world_size, (rank + 1) * n // world_size)


@dataclass(frozen=True)
class ShardPlan:
    """One rank's share of the model, as ranges of global indices."""

    rank: int
    world_size: int
    head_dim: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab: range  # real token ids this rank holds
    vocab_shard: int  # rows per rank: ceil(vocab / tp), the last rank's padded with zeros
    # Each expert's intermediate range (a mixture of experts splits every expert alike).
    expert_intermediate: range = range(0)

    @classmethod
    def for_rank(cls, spec: ModelSpec, rank: int = 0, world_size: int = 1) -> ShardPlan:
        """The split for `rank` of `world_size`; raises TensorParallelSplitError if none."""
        h, k = spec.num_heads, spec.num_kv_heads
        if k >= world_size:
            kv = _even_range(k, rank, world_size)
            group = h // k
            q = range(kv.start * group, kv.stop * group)
        else:
            if world_size % k or h % world_size:
                raise TensorParallelSplitError(
                    f"Cannot split {h} attention heads over {k} KV heads across "
                    f"{world_size} ranks: with fewer KV heads than ranks, the ranks must be a "
                    f"multiple of the KV heads and divide the attention heads.")
            q = _even_range(h, rank, world_size)
            first_kv = rank * k // world_size
            kv = range(first_kv, first_kv + 1)
        dense = spec.moe is None or len(spec.moe.layers) < spec.num_layers
        if dense and spec.intermediate_size < world_size:
            raise TensorParallelSplitError(
                f"Cannot split an MLP of {spec.intermediate_size} across {world_size} ranks.")
        experts = range(0)
        if spec.moe is not None:
            if spec.moe.intermediate_size < world_size:
                raise TensorParallelSplitError(
                    f"Cannot split experts of {spec.moe.intermediate_size} across "
                    f"{world_size} ranks.")
            experts = _even_range(spec.moe.intermediate_size, rank, world_size)
        shard = -(-spec.vocab_size // world_size)
        vocab = range(min(rank * shard, spec.vocab_size), min((rank + 1) * shard, spec.vocab_size))
        return cls(rank, world_size, spec.head_dim, q, kv,
                   _even_range(spec.intermediate_size, rank, world_size), vocab, shard,
                   experts)

    @property
    def num_q_heads(self) -> int:
        return len(self.q_heads)

    @property
    def num_kv_heads(self) -> int:
        return len(self.kv_heads)

    def num_parameters(self, spec: ModelSpec) -> int:
        """Parameters this rank holds: its slices, plus the norms (and a mixture's router)
        every rank keeps whole; every expert of a mixture (each expert's slice)."""
        h, d = spec.hidden_size, spec.head_dim
        q, kv, inter = self.num_q_heads * d, self.num_kv_heads * d, len(self.intermediate)
        attn = h * (q + 2 * kv) + q * h
        attn += (q + 2 * kv) * spec.qkv_bias + h * spec.o_bias + 2 * d * spec.qk_norm
        attn += self.num_q_heads * spec.attention_sinks
        norms = (4 if spec.sandwich_norms else 2) * h
        total = 0
        for layer in range(spec.num_layers):
            if spec.is_moe_layer(layer):
                moe = spec.moe
                assert moe is not None
                i = len(self.expert_intermediate)
                per_expert = 3 * h * i + (2 * i + h) * moe.expert_bias
                mlp = moe.num_experts * (per_expert + h) + moe.num_experts * moe.router_bias
            else:
                mlp = 3 * h * inter + (2 * inter + h) * spec.mlp_bias
            total += attn + mlp + norms
        vocab = self.vocab_shard * h * (1 if spec.tie_word_embeddings else 2)
        return total + vocab + h

    def num_expert_weights(self, spec: ModelSpec) -> int:
        """Of num_parameters, the experts' matrices (without their biases): what a checkpoint
        may store in another format (gpt-oss's MXFP4)."""
        if spec.moe is None:
            return 0
        i = len(self.expert_intermediate)
        return len(spec.moe.layers) * spec.moe.num_experts * 3 * spec.hidden_size * i

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the checkpoint tensor `name` (Hugging Face naming, without
        the `model.` and `layers.N.` prefixes)."""
        if self.world_size == 1:
            return tensor
        if name == "self_attn.sinks":  # one per query head
            return tensor[self.q_heads.start : self.q_heads.stop]
        module, kind = name.rsplit(".", 1)
        d = self.head_dim
        rows = {
            "self_attn.q_proj": range(self.q_heads.start * d, self.q_heads.stop * d),
            "self_attn.k_proj": range(self.kv_heads.start * d, self.kv_heads.stop * d),
            "self_attn.v_proj": range(self.kv_heads.start * d, self.kv_heads.stop * d),
            "mlp.gate_proj": self.intermediate,
            "mlp.up_proj": self.intermediate,
        }
        cols = {
            "self_attn.o_proj": range(self.q_heads.start * d, self.q_heads.stop * d),
            "mlp.down_proj": self.intermediate,
        }
        if module in rows:
            r = rows[module]
            return tensor[r.start : r.stop]
        if module in cols and kind == "weight":  # a row-parallel bias is added whole, once
            c = cols[module]
            return tensor[:, c.start : c.stop]
        if module in ("embed_tokens", "lm_head"):
            part = tensor[self.vocab.start : self.vocab.stop]
            pad = self.vocab_shard - part.shape[0]
            return torch.nn.functional.pad(part, (0, 0, 0, pad)) if pad else part
        return tensor  # norms (q/k norms are per head_dim, shared by every head)

    def shard_expert(self, part: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of one expert's weight: `part` "gate" or "up" ([I, H] rows of
        its intermediate range), "down" ([H, I] columns), "gate_bias"/"up_bias" ([I])."""
        if self.world_size == 1:
            return tensor
        r = self.expert_intermediate
        if part == "down":
            return tensor[:, r.start : r.stop]
        return tensor[r.start : r.stop]

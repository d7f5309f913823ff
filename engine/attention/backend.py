"""The contract between the engine and its attention backends: one step's metadata, in the
one format every backend reads, and the `AttentionBackend` protocol.

ModelRunner builds an `AttentionMetadata` once per step and hands it to the backend before
the forward; every layer then reads it. The backends (engine/attention/torch_backend.py,
cpu_backend.py, triton_backend.py, row_attention.py) read the paged KV cache through the block
tables. A backend rotates q and k itself (the rotary and the KV write are one kernel on the
GPU), so the model hands them over un-rotated with the step's cos/sin rows.

A model whose layers differ in attention (sliding windows, engine/core/kv_cache_groups.py)
has a block table and a slot mapping per KV cache group; each layer reads its group's
(`LayerAttention.group`), with its own window and sinks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention needs besides its caches: its KV cache group (which block
    table and slot mapping it reads), its sliding window (None: full attention) and its
    softmax sinks (gpt-oss: float32 [this rank's query heads])."""

    group: int = 0
    window: int | None = None
    sinks: torch.Tensor | None = None


def uniform_layers(num_layers: int) -> list[LayerAttention]:
    """Every layer full attention, in one group, without sinks (Llama, Qwen...)."""
    return [LayerAttention() for _ in range(num_layers)]


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by every layer.

    The step's B sequences are in batch order; q's rows hold each one's new tokens back to
    back. Sequences [0, num_decodes) have exactly one new token each and may run as decodes;
    every later sequence, whatever its query length, runs as a (possibly chunked) prefill.
    The device tensors are what kernels read; the host fields mirror them, so a backend
    never syncs with the device to learn a shape or a loop bound.
    """

    # [G, T] int64: per KV cache group, the flat cache slot each new token is written to
    # (-1: none)
    slot_mapping: torch.Tensor
    # [G, B, max_blocks] int64: per group, each sequence's block table, padded with (and,
    # behind a sliding window, holding) the always-zero null block
    block_tables: torch.Tensor
    seq_lens: torch.Tensor  # [B] int32, cached tokens once this step's are written
    query_start_loc: torch.Tensor  # [B+1] int32, sequence b's queries are rows [qsl[b], qsl[b+1])
    num_decodes: int  # leading sequences with one new token each
    max_query_len: int  # the longest sequence's new tokens (0 for an empty step)
    seq_lens_host: list[int]  # [B] seq_lens on the host
    query_start_loc_host: list[int]  # [B+1] query_start_loc on the host
    # Per sequence, position spans [start, end) whose tokens attend to each other both ways
    # on top of the causal rule (an image's tokens in Gemma 3; within a sliding layer's
    # window still); None when no sequence has one. The scheduler keeps a span within one
    # prefill chunk, so a span's keys are all this step's or all cached.
    bidirectional: list[list[tuple[int, int]]] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)


class AttentionBackend(Protocol):
    """Paged attention over one model's KV caches (a [blocks, block_size, Hk, D] tensor per
    layer for keys, one for values; layers of different groups may share a tensor, each
    reading its pages through its own group's block table).

    A backend whose forward is captured in a CUDA graph (engine/worker/cuda_graphs.py) must read
    per-sequence values only from the metadata's device tensors: at replay the host fields
    are those of the capture, of which only num_decodes and max_query_len stay true.
    """

    metadata: AttentionMetadata | None  # the step's, once set

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take this step's metadata; every forward until the next call reads it."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Apply the neox rotary to this step's q [T, Hq, D] and k [T, Hk, D] (handed over
        before it) with cos/sin [T, R], the rows of the step's tokens (R < D: a partial
        rotary turns each head's first R values); write the rotated k and v [T, Hk, D] into
        layer's cache at its group's slot mapping; return causal attention of the rotated q
        over each sequence's cached tokens, within the layer's window, with its sinks."""
        ...

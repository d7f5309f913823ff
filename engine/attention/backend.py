"""The contract between the engine and its attention backends: one step's metadata, in the
one format every backend reads, and the `AttentionBackend` protocol.

ModelRunner builds an `AttentionMetadata` once per step and hands it to the backend before
the forward; every layer then reads it. The backends (engine/attention/torch_backend.py,
cpu_backend.py, triton_backend.py, row_attention.py) read the paged KV cache through the block
tables. A backend rotates q and k itself (the rotary and the KV write are one kernel on the
GPU), so the model hands them over un-rotated with the step's cos/sin rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by every layer.

    The step's B sequences are in batch order; q's rows hold each one's new tokens back to
    back. Sequences [0, num_decodes) have exactly one new token each and may run as decodes;
    every later sequence, whatever its query length, runs as a (possibly chunked) prefill.
    The device tensors are what kernels read; the host fields mirror them, so a backend
    never syncs with the device to learn a shape or a loop bound.
    """

    slot_mapping: torch.Tensor  # [T] int64, flat cache slot each new token is written to; -1: none
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with the (always zero) null block
    seq_lens: torch.Tensor  # [B] int32, cached tokens once this step's are written
    query_start_loc: torch.Tensor  # [B+1] int32, sequence b's queries are rows [qsl[b], qsl[b+1])
    num_decodes: int  # leading sequences with one new token each
    max_query_len: int  # the longest sequence's new tokens (0 for an empty step)
    seq_lens_host: list[int]  # [B] seq_lens on the host
    query_start_loc_host: list[int]  # [B+1] query_start_loc on the host

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)


class AttentionBackend(Protocol):
    """Paged attention over one model's KV caches (one [blocks, block_size, Hk, D] tensor
    per layer for keys, one for values).

    A backend whose forward is captured in a CUDA graph (engine/worker/cuda_graphs.py) must read
    per-sequence values only from the metadata's device tensors: at replay the host fields
    are those of the capture, of which only num_decodes and max_query_len stay true.
    """

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take this step's metadata; every forward until the next call reads it."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Apply the neox rotary to this step's q [T, Hq, D] and k [T, Hk, D] (handed over
        before it) with cos/sin [T, D], the rows of the step's tokens; write the rotated k and
        v [T, Hk, D] into layer's cache at the slot mapping; return causal attention of the
        rotated q over each sequence's cached tokens."""
        ...

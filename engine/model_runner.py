"""Turns a SchedulerOutput into flat tensors, runs the model, samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine import kernels_ops
from engine.attention import AttentionMetadata, PrefillSpan
from engine.core.request import Request
from engine.core.scheduler_output import SchedulerOutput
from engine.model_spec import ModelSpec
from engine.sampler import Sampler, SamplerOutput


@dataclass
class StepBatch:
    """One step's work as plain arrays, without Request objects: what every tensor-parallel
    rank needs to run the forward. Rank 0 builds it from the SchedulerOutput and broadcasts
    it; it is the whole per-step message to the other ranks."""

    token_ids: np.ndarray  # [T] int64, every scheduled token in batch order
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64, flat KV slot each token is written to
    query_lens: list[int]  # [B] new tokens per sequence
    context_lens: list[int]  # [B] tokens in the KV cache once this step has run
    block_tables: list[list[int]]  # [B] block ids per sequence
    logits_indices: list[int]  # rows whose logits are sampled


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_indices: torch.Tensor
    metadata: AttentionMetadata
    sampling_requests: list[Request]


class ModelRunner:
    """Owns the model, the KV cache tensors, the attention backend and the sampler.

    Under tensor parallelism every rank has one, holding its shard of the model and of the
    KV pool (its KV heads); only rank 0's samples.
    """

    def __init__(self, model: Any, spec: ModelSpec, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, seed: int = 0,
                 attention_backend: str | None = None) -> None:
        self.model = model
        self.spec = spec
        self.block_size = block_size
        self.device = device
        # One extra, never-allocated block stays zero: padded reads point at it. Masked keys
        # get zero weight, but 0 * NaN is NaN, so padding must never read a stale NaN.
        self.null_block = num_blocks
        shape = (num_blocks + 1, block_size, model.plan.num_kv_heads, spec.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.attention = kernels_ops.attention_for(device, self.k_caches, self.v_caches,
                                                   spec.head_dim ** -0.5, attention_backend)
        self.decode_graphs: Any = None  # engine.cuda_graphs.DecodeGraphs once captured
        self.sampler = Sampler(seed)
        self._arange_block = torch.arange(block_size, device=device)

    def batch_for(self, so: SchedulerOutput) -> tuple[StepBatch, list[Request]]:
        """Flatten the scheduled chunks; also return the requests that sample, in row order."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_idx: list[int] = []
        sampling: list[Request] = []
        q_lens: list[int] = []
        ctx_lens: list[int] = []
        tables: list[list[int]] = []
        offset = 0
        for chunk in so.chunks:
            req, start, n = chunk.request, chunk.start, chunk.num_new_tokens
            blocks = req.block_ids
            if n == 1:  # a decode: plain ints are cheaper than numpy for one token
                ids.append(req.all_token_ids[start])
                positions.append(start)
                slots.append(blocks[start // bs] * bs + start % bs)
            else:
                ids.extend(req.all_token_ids[start : start + n])
                pos = np.arange(start, start + n, dtype=np.int64)
                positions.extend(pos.tolist())
                slots.extend((np.asarray(blocks, dtype=np.int64)[pos // bs] * bs + pos % bs).tolist())
            offset += n
            if chunk.samples:
                logits_idx.append(offset - 1)
                sampling.append(req)
            q_lens.append(n)
            ctx_lens.append(start + n)
            tables.append(blocks)
        batch = StepBatch(np.asarray(ids, dtype=np.int64), np.asarray(positions, dtype=np.int64),
                          np.asarray(slots, dtype=np.int64), q_lens, ctx_lens, tables, logits_idx)
        return batch, sampling

    def prepare(self, so: SchedulerOutput) -> StepInputs:
        """Flatten the scheduled chunks into the tensors of one forward pass."""
        batch, sampling = self.batch_for(so)
        return self.inputs_for(batch, sampling)

    def inputs_for(self, batch: StepBatch, sampling: list[Request]) -> StepInputs:
        """The tensors of one forward pass (on any rank)."""
        decode_rows: list[int] = []
        decode_ctx: list[int] = []
        decode_tables: list[list[int]] = []
        prefills: list[PrefillSpan] = []
        q_starts = [0]
        offset = 0
        for n, ctx, table in zip(batch.query_lens, batch.context_lens, batch.block_tables):
            if n == 1:
                decode_rows.append(offset)
                decode_ctx.append(ctx)
                decode_tables.append(table)
            else:
                prefills.append(self._prefill_span(offset, n, ctx, np.asarray(table, dtype=np.int64)))
            offset += n
            q_starts.append(offset)

        dev = self.device
        # Only the torch backend reads the [batch, context] gather; Triton reads block tables.
        gather = getattr(self.attention, "needs_decode_gather", True)
        decode_slots, decode_mask = self._decode_gather(decode_ctx if gather else [], decode_tables)
        md = AttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping).to(dev),
            decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=dev),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            decode_block_tables=None if gather else self._pad_tables(decode_tables),
            decode_seq_lens=None if gather else torch.tensor(decode_ctx, dtype=torch.long, device=dev),
            prefills=prefills,
            block_tables=self._pad_tables(batch.block_tables),
            seq_lens=torch.tensor(batch.context_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(q_starts, dtype=torch.int32, device=dev),
        )
        return StepInputs(
            input_ids=torch.from_numpy(batch.token_ids).to(dev),
            positions=torch.from_numpy(batch.positions).to(dev),
            logits_indices=torch.tensor(batch.logits_indices, dtype=torch.long, device=dev),
            metadata=md,
            sampling_requests=sampling,
        )

    def _prefill_span(self, offset: int, n: int, ctx: int, blocks: np.ndarray) -> PrefillSpan:
        if ctx == n:
            return PrefillSpan(offset, n, ctx, None, None)
        bs = self.block_size
        all_pos = np.arange(ctx, dtype=np.int64)
        slots = torch.from_numpy(blocks[all_pos // bs] * bs + all_pos % bs).to(self.device)
        q_pos = torch.arange(ctx - n, ctx, device=self.device).unsqueeze(1)
        mask = torch.arange(ctx, device=self.device).unsqueeze(0) <= q_pos
        return PrefillSpan(offset, n, ctx, slots, mask)

    def _decode_gather(self, ctx_lens: list[int], tables: list[list[int]]):
        dev, bs = self.device, self.block_size
        if not ctx_lens:
            return (torch.empty(0, 0, dtype=torch.long, device=dev),
                    torch.empty(0, 1, 1, 0, dtype=torch.bool, device=dev))
        max_len = max(ctx_lens)
        bt = self._pad_tables(tables, -(-max_len // bs))
        slots = (bt.unsqueeze(-1) * bs + self._arange_block).view(len(tables), -1)[:, :max_len]
        lens = torch.tensor(ctx_lens, device=dev)
        mask = torch.arange(max_len, device=dev).unsqueeze(0) < lens.unsqueeze(1)
        return slots, mask[:, None, None, :]

    def scrub_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks a failed request wrote (they may hold NaN that a later reader's masked
        tail would turn into NaN output)."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for cache in self.k_caches + self.v_caches:
            cache.index_fill_(0, idx, 0)

    def _pad_tables(self, tables: list[list[int]], width: int | None = None) -> torch.Tensor:
        width = width or max((len(t) for t in tables), default=0)
        out = np.full((len(tables), width), self.null_block, dtype=np.int64)
        for i, t in enumerate(tables):
            t = t[:width]
            out[i, : len(t)] = t
        return torch.from_numpy(out).to(self.device)

    def capture_decode_graphs(self, max_batch: int, max_model_len: int,
                              use_graphs: bool = True) -> None:
        """Capture CUDA graphs for decode steps of up to max_batch sequences (CUDA only;
        use_graphs=False runs the same padded path eagerly, for tests)."""
        from engine.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.attention, max_batch,
                              -(-max_model_len // self.block_size), self.null_block,
                              self.device, use_graphs)
        graphs.capture()
        self.decode_graphs = graphs

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> SamplerOutput:
        """Run one step; return the sampled tokens of the requests that sample, in order."""
        self.sampler.release(so.finished_request_ids)
        return self.execute_batch(*self.batch_for(so))

    @torch.inference_mode()
    def execute_batch(self, batch: StepBatch, sampling: list[Request]) -> SamplerOutput:
        """Run one built step (every rank runs this; only rank 0 has logits to sample)."""
        inputs = self.inputs_for(batch, sampling)
        n = inputs.input_ids.shape[0]
        graphs = self.decode_graphs
        if graphs is not None and graphs.can_run(n, inputs.metadata) and \
                inputs.logits_indices.shape[0] == n:
            logits = graphs.run(inputs.input_ids, inputs.positions, inputs.metadata)
        else:
            self.attention.metadata = inputs.metadata
            logits = self.model(inputs.input_ids, inputs.positions, self.attention,
                                inputs.logits_indices)
        if not inputs.sampling_requests or logits is None:
            return SamplerOutput.empty()
        return self.sampler(logits, inputs.sampling_requests)

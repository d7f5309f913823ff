"""Turns a SchedulerOutput into flat tensors, runs the model, samples."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from officellm.engine.attention import selection
from officellm.engine.attention.backend import AttentionBackend, AttentionMetadata
from officellm.engine.core.kv_cache_groups import KVCacheGroups
from officellm.engine.core.scheduler_output import SamplerOutput, SchedulerOutput
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.vision import VisionTower
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.encoder_cache import EncoderCache, ImageSlice
from officellm.engine.worker.host_to_device import stage_int64, to_device
from officellm.engine.worker.pending_samples import PendingSamples
from officellm.engine.worker.sampler import Sampler
from officellm.engine.worker.sampling_metadata import (
    PromptLogprobRows,
    SamplingMetadata,
    SamplingRow,
)
from officellm.kernels.reference.reference import cache_row_width

if TYPE_CHECKING:
    from officellm.engine.worker.cuda_graphs import DecodeGraphs


@dataclass
class StepBatch:
    """One step's work as plain arrays, without Request objects: what every tensor-parallel
    rank needs to run the forward. Rank 0 builds it from the SchedulerOutput and broadcasts
    it; it is the whole per-step message to the other ranks."""

    token_ids: np.ndarray  # [T] int64, every scheduled token in batch order
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [G, T] int64, per KV cache group the flat slot of each token
    query_lens: list[int]  # [B] new tokens per sequence
    context_lens: list[int]  # [B] tokens in the KV cache once this step has run
    block_tables: list[list[list[int]]]  # [G][B] block ids per group and sequence
    logits_indices: list[int]  # rows whose logits are sampled
    # Async scheduling (rank 0 alone): token rows whose id the previous step sampled and the
    # host has not read yet, and each one's row in that step's samples (read on the device).
    from_previous: list[int] = field(default_factory=list)
    previous_rows: list[int] = field(default_factory=list)
    # Images (rank 0 alone: a vision model runs on one rank): the placeholder rows the
    # vision tower's outputs replace, and per sequence the [start, end) position spans
    # whose tokens attend to each other both ways (a model with bidirectional images).
    images: list[ImageSlice] = field(default_factory=list)
    bidirectional: list[list[tuple[int, int]]] | None = None


@dataclass
class QueuedForward:
    """A step whose forward is queued on the device, its sampling not yet."""

    so: SchedulerOutput
    logits: torch.Tensor | None  # [sampled rows, vocab] float32; None: nothing to sample
    sampling: SamplingMetadata


@dataclass(frozen=True)
class BlocksOnHost:
    """KV blocks copied to the host: row i is block i's bytes, once `ready` (a CUDA event;
    None: already there)."""

    rows: torch.Tensor  # [blocks, block bytes] uint8
    ready: Any = None

    def payloads(self) -> list[bytes]:
        """Each block's bytes (waits for the copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        return [row.numpy().tobytes() for row in self.rows]


@dataclass
class StepInputs:
    """One forward pass's tensors on this rank's device, and who samples from it."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_indices: torch.Tensor
    metadata: AttentionMetadata
    sampling: SamplingMetadata


def kv_cache_groups(spec: ModelSpec) -> KVCacheGroups:
    """The model's layers in KV cache groups, by their windows."""
    return KVCacheGroups.for_windows(spec.layer_windows)


def _contiguous_runs(block_ids: list[int], payloads: list[memoryview], block_bytes: int
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The payloads as runs of blocks that lie back to back in memory: per run, its block
    ids and a [blocks, block_bytes] view of its bytes (no copy)."""
    arrays = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
    runs: list[tuple[np.ndarray, np.ndarray]] = []
    start = 0
    while start < len(arrays):
        base = arrays[start].ctypes.data
        end = start + 1
        while end < len(arrays) and arrays[end].ctypes.data == base + (end - start) * block_bytes:
            end += 1
        # Blocks start..end-1 are one span of memory, kept alive by arrays[start:end].
        rows = np.lib.stride_tricks.as_strided(arrays[start], (end - start, block_bytes),
                                               (block_bytes, 1), writeable=False)
        runs.append((np.asarray(block_ids[start:end]), rows))
        start = end
    return runs


class ModelRunner:
    """Owns the model, the KV cache tensors, the attention backend and the sampler.

    Under tensor parallelism every rank has one, holding its shard of the model and of the
    KV pool (its KV heads); only rank 0's samples.
    """

    def __init__(self, model: Any, spec: ModelSpec, num_blocks: int, block_size: int,
                 kv_dtype: torch.dtype, device: torch.device, seed: int = 0,
                 attention_backend: str | None = None, batch_invariant: bool = False,
                 vision: VisionTower | None = None) -> None:
        self.model = model
        self.spec = spec
        self.block_size = block_size
        self.device = device
        self.groups = kv_cache_groups(spec)
        # One extra, never-allocated block stays zero: padded reads, and a sliding window's
        # passed entries, point at it (the KV manager's null_block_id). Masked keys get zero
        # weight, but 0 * NaN is NaN, so padding must never read a stale NaN.
        self.null_block = num_blocks
        shape = (num_blocks + 1, block_size, model.plan.num_kv_heads,
                 cache_row_width(spec.head_dim, kv_dtype))
        # kv_dtype: the compute dtype, 16 bits under a float32 model, or one byte (fp8; int8
        # with each row's scale after its values): engine/precision/kv_cache_dtype.py. A block is a
        # page in each of the pool's tensors; layer l keeps its pages in the tensor its
        # place in its group names (engine/core/kv_cache_groups.py).
        self.k_pool = [torch.zeros(shape, dtype=kv_dtype, device=device)
                       for _ in range(self.groups.layers_per_block)]
        self.v_pool = [torch.zeros(shape, dtype=kv_dtype, device=device)
                       for _ in range(self.groups.layers_per_block)]
        places = [self.groups.place(layer) for layer in range(spec.num_layers)]
        self.k_caches = [self.k_pool[tensor] for _, tensor in places]
        self.v_caches = [self.v_pool[tensor] for _, tensor in places]
        self.attention: AttentionBackend = selection.attention_for(
            device, self.k_caches, self.v_caches, spec.scale, attention_backend,
            batch_invariant, model.attention_layers(self.groups))
        # The vision tower and its outputs until their placeholder tokens are computed.
        self.encoder_cache = EncoderCache(vision) if vision is not None else None
        self.decode_graphs: DecodeGraphs | None = None  # once captured
        self.sampler = Sampler(seed)
        # The last sampled step, its samples still on the device, and the row of each
        # request whose next input token is among them (async scheduling reads it there).
        self._previous: PendingSamples | None = None
        self._previous_so: SchedulerOutput | None = None
        self._previous_rows: dict[str, int] | None = None

    def batch_for(self, so: SchedulerOutput) -> tuple[StepBatch, SamplingMetadata]:
        """Flatten the scheduled chunks; also return what the sampler reads of the requests
        that sample, in row order."""
        bs = self.block_size
        num_groups = self.groups.num_groups
        # A long-context request's rotary rows (LongRoPE's long factors) follow the short.
        long_offset = self.model.rotary_long_offset
        ids: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in range(num_groups)]
        logits_idx: list[int] = []
        sampling: list[SamplingRow] = []
        q_lens: list[int] = []
        ctx_lens: list[int] = []
        tables: list[list[list[int]]] = [[] for _ in range(num_groups)]
        from_previous: list[int] = []
        previous_rows: list[int] = []
        # Prompt logprobs' rows go after every sampled row: the sampler reads the sampled
        # ones as the logits' leading rows, and their order stays the one they had.
        prompt_idx: list[int] = []
        prompt_rows: list[PromptLogprobRows] = []
        images: list[ImageSlice] = []
        bidirectional: list[list[tuple[int, int]]] = []
        offset = 0
        for chunk in so.chunks:
            req, start, n = chunk.request, chunk.start, chunk.num_new_tokens
            spans: list[tuple[int, int]] = []
            if req.images and start < req.images[-1].end and not chunk.draft:
                spans = self._image_slices(req, start, n, offset, images)
            bidirectional.append(spans)
            if n == 1:  # a decode: plain ints are cheaper than numpy for one token
                if start < len(req.all_token_ids):
                    ids.append(req.all_token_ids[start])
                else:  # sampled by the step still in flight: read on the device
                    from_previous.append(offset)
                    previous_rows.append(self._row_in_previous(req.request_id))
                    ids.append(0)
                positions.append(start + long_offset if req.long_context else start)
                for g, blocks in enumerate(req.block_ids):
                    slots[g].append(blocks[start // bs] * bs + start % bs)
            else:
                if chunk.draft:  # its last known token, then the drafts it verifies
                    ids.append(req.all_token_ids[start])
                    ids.extend(chunk.draft)
                else:
                    ids.extend(req.all_token_ids[start : start + n])
                pos = np.arange(start, start + n, dtype=np.int64)
                positions.extend((pos + long_offset).tolist() if req.long_context
                                 else pos.tolist())
                for g, blocks in enumerate(req.block_ids):
                    slots[g].extend((np.asarray(blocks, dtype=np.int64)[pos // bs] * bs
                                     + pos % bs).tolist())
            offset += n
            if chunk.draft:  # every position samples: the model's token after each draft
                logits_idx.extend(range(offset - n, offset))
                sampling.extend(SamplingRow.with_drafts(req, chunk.draft))
            elif chunk.samples:
                logits_idx.append(offset - 1)
                sampling.append(SamplingRow.of(req))
            lp_positions = chunk.prompt_logprob_positions
            if lp_positions:
                first = offset - n - start  # the batch row of the request's position 0
                prompt_idx.extend(range(first + lp_positions.start, first + lp_positions.stop))
                prompt_rows.append(PromptLogprobRows(
                    req.request_id,
                    req.prompt_token_ids[lp_positions.start + 1:lp_positions.stop + 1],
                    req.params.prompt_logprobs or 0))
            q_lens.append(n)
            ctx_lens.append(start + n)
            for g, blocks in enumerate(req.block_ids):
                tables[g].append(blocks)
        batch = StepBatch(np.asarray(ids, dtype=np.int64), np.asarray(positions, dtype=np.int64),
                          np.asarray(slots, dtype=np.int64).reshape(num_groups, -1), q_lens,
                          ctx_lens, tables, logits_idx + prompt_idx, from_previous,
                          previous_rows, images,
                          bidirectional if any(bidirectional) else None)
        return batch, SamplingMetadata(sampling, prompt_rows)

    def _image_slices(self, req: Any, start: int, n: int, row: int,
                      out: list[ImageSlice]) -> list[tuple[int, int]]:
        """Append the slices of `req`'s images that its chunk [start, start + n) computes
        (the chunk's first token at flat row `row`); return the spans of those images when
        the model's image tokens attend both ways, else none."""
        cache = self.encoder_cache
        if cache is None:
            raise ValueError("A request with images reached a model without a vision tower.")
        spans: list[tuple[int, int]] = []
        end = start + n
        for index, image in enumerate(req.images):
            first, last = max(start, image.offset), min(end, image.end)
            if first >= last:
                continue
            out.append(ImageSlice(req.request_id, index, image, row + first - start,
                                  first - image.offset, last - first))
            if cache.tower.bidirectional_images:
                spans.append((image.offset, image.end))
        return spans

    def inputs_for(self, batch: StepBatch, sampling: SamplingMetadata) -> StepInputs:
        """The tensors of one forward pass (on any rank): staged in one host buffer and copied
        to the device once, without waiting for it (engine/worker/host_to_device.py); input
        tokens still on the device (async scheduling) are gathered there."""
        q_lens = np.asarray(batch.query_lens, dtype=np.int64)
        qsl = np.zeros(len(q_lens) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=qsl[1:])
        seq_lens = np.asarray(batch.context_lens, dtype=np.int64)
        tables = self._pad_tables(batch.block_tables)
        ids, positions, logits_indices, slots, seq_lens_t, qsl_t, tables_t, from_previous, \
            previous_rows = stage_int64(
                [batch.token_ids, batch.positions,
                 np.asarray(batch.logits_indices, dtype=np.int64), batch.slot_mapping, seq_lens,
                 qsl, tables, np.asarray(batch.from_previous, dtype=np.int64),
                 np.asarray(batch.previous_rows, dtype=np.int64)], self.device)
        if batch.from_previous:
            assert self._previous is not None, "a token of a step never launched"
            ids.index_copy_(0, from_previous, self._previous.tokens.index_select(0, previous_rows))
        # The scheduler puts running decodes first; a one-token chunk after a prefill (a
        # clipped chunk, a prompt whose prefix is cached) simply runs as a prefill.
        longer = np.flatnonzero(q_lens != 1)
        num_decodes = int(longer[0]) if longer.size else len(q_lens)
        metadata = AttentionMetadata(
            slot_mapping=slots.view(batch.slot_mapping.shape),
            block_tables=tables_t.view(tables.shape),
            # The kernels read 32-bit lengths: converted on the device, after the one copy.
            seq_lens=seq_lens_t.to(torch.int32),
            query_start_loc=qsl_t.to(torch.int32),
            num_decodes=num_decodes,
            max_query_len=int(q_lens.max()) if q_lens.size else 0,
            seq_lens_host=seq_lens.tolist(),
            query_start_loc_host=qsl.tolist(),
            bidirectional=batch.bidirectional,
        )
        return StepInputs(input_ids=ids, positions=positions, logits_indices=logits_indices,
                          metadata=metadata, sampling=sampling)

    def scrub_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks a failed request wrote (they may hold NaN that a later reader's masked
        tail would turn into NaN output)."""
        idx = to_device(block_ids, torch.long, self.device)
        for cache in self.k_pool + self.v_pool:
            # Through the bytes: torch has no fp8 index_fill_, and zero is all-zero bytes in
            # every cache dtype.
            cache.view(torch.uint8).index_fill_(0, idx, 0)

    @property
    def block_bytes(self) -> int:
        """A block's bytes: its page in each of the pool's cache tensors, K then V."""
        return sum(cache[0].numel() * cache.element_size() for cache in self.k_pool + self.v_pool)

    def read_blocks(self, block_ids: list[int]) -> BlocksOnHost:
        """Copy blocks out to the host (for a lower tier), queued after the work already
        queued on the device: a step's forward writes them first."""
        idx = to_device(block_ids, torch.long, self.device)
        pages = torch.cat([cache.view(torch.uint8).index_select(0, idx).flatten(1)
                           for cache in self.k_pool + self.v_pool], dim=1)
        if self.device.type != "cuda":
            return BlocksOnHost(pages, None)
        host = torch.empty(pages.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(pages, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return BlocksOnHost(host, done)

    def write_blocks(self, block_ids: list[int], payloads: list[memoryview],
                     wait: bool = False) -> None:
        """Copy blocks in from the host (a lower tier's), each laid out as read_blocks'.
        Blocks nobody's step reads (set aside for a waiting request), so it may run on
        another thread than the steps'; there, `wait` returns only once a device's copy is
        done (the engine's thread needs no wait: its later steps are queued after it)."""
        pools = [cache.view(torch.uint8) for cache in self.k_pool + self.v_pool]
        if self.device.type == "cpu":
            # Straight from the bytes into the pool: no staging copy, whose fresh pages cost
            # more than the copy (a 4k-token prefix is ~100 MB of page faults). Blocks read
            # into one buffer lie back to back: each such run is one copy per cache tensor.
            pages = [pool.numpy().reshape(pool.shape[0], -1) for pool in pools]
            for ids, rows in _contiguous_runs(block_ids, payloads, self.block_bytes):
                offset = 0
                for page in pages:
                    page[ids] = rows[:, offset:offset + page.shape[1]]
                    offset += page.shape[1]
            return
        idx = to_device(block_ids, torch.long, self.device)
        rows = torch.empty((len(payloads), self.block_bytes), dtype=torch.uint8, pin_memory=True)
        host = rows.numpy()
        for i, payload in enumerate(payloads):
            host[i] = np.frombuffer(payload, dtype=np.uint8)  # one copy, from read-only bytes
        data = rows.to(self.device, non_blocking=True)
        offset = 0
        for pool in pools:
            size = pool[0].numel()
            # Each tensor's pages straight from their columns of the rows: no copy between.
            pool.index_copy_(0, idx, data[:, offset:offset + size].unflatten(1, pool.shape[1:]))
            offset += size
        if wait:
            torch.cuda.current_stream(self.device).synchronize()

    def _pad_tables(self, tables: list[list[list[int]]]) -> np.ndarray:
        """[G, B, longest table] int64, padded with the null block (a request's tables are
        as long in every group)."""
        first = tables[0]
        lens = np.fromiter(map(len, first), dtype=np.int64, count=len(first))
        width = int(lens.max()) if len(first) else 0
        out = np.full((len(tables), len(first), width), self.null_block, dtype=np.int64)
        # One vectorized scatter instead of a row copy per sequence.
        rows = np.arange(width) < lens[:, None]
        for g, group in enumerate(tables):
            out[g][rows] = np.fromiter(itertools.chain.from_iterable(group), dtype=np.int64,
                                       count=int(lens.sum()))
        return out

    def capture_decode_graphs(self, max_batch: int, max_model_len: int,
                              use_graphs: bool = True) -> None:
        """Capture CUDA graphs for decode steps of up to max_batch sequences (CUDA only;
        use_graphs=False runs the same padded path eagerly, for tests)."""
        from officellm.engine.worker.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.attention, max_batch,
                              -(-max_model_len // self.block_size), self.null_block,
                              self.device, use_graphs, self.groups.num_groups)
        graphs.capture()
        self.decode_graphs = graphs

    @torch.inference_mode()
    def launch(self, so: SchedulerOutput) -> QueuedForward:
        """Queue one step's forward on the device; `sample` queues its sampling. A decode
        whose input token the previous step sampled, not yet read by the host, takes it from
        there on the device (async scheduling). One process only: the other tensor-parallel
        ranks never have that token."""
        self.sampler.release(so.finished_request_ids)
        if self.encoder_cache is not None:
            self.encoder_cache.release(so.finished_request_ids)
        batch, sampling = self.batch_for(so)
        return QueuedForward(so, self.forward(batch, sampling), sampling)

    @torch.inference_mode()
    def sample(self, queued: QueuedForward,
               grammar: GrammarBitmask | None = None) -> PendingSamples | None:
        """Queue the sampling of a launched forward and return its samples unread (None:
        nothing samples). The requests' penalties, min_tokens and grammar masks are read
        now, so under async scheduling they already count the previous step's tokens."""
        pending = None
        sampling = queued.sampling
        if (sampling.rows or sampling.prompt_rows) and queued.logits is not None:
            pending = self.sampler.sample(queued.logits, sampling, grammar)
        self._previous, self._previous_so, self._previous_rows = pending, queued.so, None
        return pending

    def _row_in_previous(self, request_id: str) -> int:
        """The row of the request's sample in the last sampled step (mapped on first use:
        a serial loop never asks)."""
        if self._previous_rows is None:
            rows: dict[str, int] = {}
            row = 0
            for chunk in self._previous_so.chunks if self._previous_so is not None else ():
                if chunk.samples:
                    if not chunk.draft:
                        rows[chunk.request.request_id] = row
                    row += 1 + len(chunk.draft)
            self._previous_rows = rows
        return self._previous_rows[request_id]

    @torch.inference_mode()
    def execute_batch(self, batch: StepBatch, sampling: SamplingMetadata,
                      grammar: GrammarBitmask | None = None) -> SamplerOutput:
        """Run one built step (every rank runs this; only rank 0 has logits to sample, and
        so only rank 0 has grammar masks)."""
        logits = self.forward(batch, sampling)
        if not (sampling.rows or sampling.prompt_rows) or logits is None:
            return SamplerOutput.empty()
        return self.sampler.sample(logits, sampling, grammar).result()

    def forward(self, batch: StepBatch, sampling: SamplingMetadata) -> torch.Tensor | None:
        """Queue one built step's forward; the logits of its sampled rows (None on a rank
        without them)."""
        inputs = self.inputs_for(batch, sampling)
        n = inputs.input_ids.shape[0]
        graphs = self.decode_graphs
        # The graphs return each token's logits in batch order: right only when every token
        # is a sampled row (a one-token prompt chunk looks like a decode, but its prompt
        # logprobs' row comes after the sampled rows).
        if graphs is not None and graphs.can_run(n, inputs.metadata) and \
                inputs.logits_indices.shape[0] == n and not sampling.prompt_rows and \
                not batch.images:
            return graphs.run(inputs.input_ids, inputs.positions, inputs.metadata)
        self.attention.set_metadata(inputs.metadata)
        image_embeds = None
        if batch.images:
            assert self.encoder_cache is not None  # _image_slices refused it otherwise
            image_embeds = self.encoder_cache.embeds_for(batch.images, self.device)
        return self.model(inputs.input_ids, inputs.positions, self.attention,
                          inputs.logits_indices, image_embeds)

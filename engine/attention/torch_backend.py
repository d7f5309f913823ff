"""The torch attention backend: the reference on any device, and the fallback on a CPU
without a C++ compiler.

It reads keys and values through the block tables like the kernels do, gathering whole
cache blocks: one batched gather and one SDPA call for all decodes (the group's query heads
folded into a query length, so GQA needs no repeat), and one per prefill, whose causal mask
is offset by the tokens already cached. What the gathers need is derived once per step, in
set_metadata, not once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from officellm.engine.attention.backend import AttentionMetadata
from officellm.kernels.ops import ApplyRotary
from officellm.kernels.reference import reference


@dataclass
class PrefillPlan:
    """One prefill sequence of the step, as the torch backend runs it."""

    q_start: int
    q_len: int
    seq_len: int  # cached tokens plus this step's
    blocks: torch.Tensor | None  # the blocks holding its seq_len keys; None: all are this step's
    mask: torch.Tensor | None  # [q_len, seq_len] bool; None when plainly causal


class TorchAttention:
    """Reference paged attention with torch ops (SDPA), after `rotary` (the model's
    KernelOps.apply_rotary) and the reference's KV write."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 scale: float, rotary: ApplyRotary) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.rotary = rotary
        self.block_size = k_caches[0].shape[1]
        self.metadata: AttentionMetadata | None = None
        self.prefills: list[PrefillPlan] = []
        self._decode_blocks = torch.empty(0, 0, dtype=torch.long)
        self._decode_len = 0
        self._decode_mask = torch.empty(0, 1, 1, 0, dtype=torch.bool)

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take the step's metadata and derive the decode gather and the prefill plans."""
        self.metadata = metadata
        self._plan_decodes(metadata)
        self.prefills = self._plan_prefills(metadata)

    def _plan_decodes(self, md: AttentionMetadata) -> None:
        nd = md.num_decodes
        if not nd:
            return
        # Gather only as many blocks as the longest decode needs, and keys up to its length
        # (shorter sequences are masked), so the batch is no wider than its longest context.
        self._decode_len = max(md.seq_lens_host[:nd])
        self._decode_blocks = md.block_tables[:nd, : -(-self._decode_len // self.block_size)]
        keys = torch.arange(self._decode_len, device=md.seq_lens.device)
        self._decode_mask = (keys < md.seq_lens[:nd, None])[:, None, None, :]

    def _plan_prefills(self, md: AttentionMetadata) -> list[PrefillPlan]:
        plans = []
        qsl, lens, bs = md.query_start_loc_host, md.seq_lens_host, self.block_size
        dev = md.block_tables.device
        for b in range(md.num_decodes, md.num_seqs):
            start, n, ctx = qsl[b], qsl[b + 1] - qsl[b], lens[b]
            if n == 0:
                continue
            if ctx == n:  # nothing cached before it: attend to this step's own keys
                plans.append(PrefillPlan(start, n, ctx, None, None))
                continue
            q_pos = torch.arange(ctx - n, ctx, device=dev).unsqueeze(1)
            mask = torch.arange(ctx, device=dev).unsqueeze(0) <= q_pos
            plans.append(PrefillPlan(start, n, ctx, md.block_tables[b, : -(-ctx // bs)], mask))
        return plans

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate q/k, store k/v in the layer's cache, then attend (see
        AttentionBackend.forward)."""
        md = self.metadata
        assert md is not None, "set_metadata before forward"
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        q, k = self.rotary(q, k, cos, sin)
        reference.write_kv_cache(k, v, kc, vc, md.slot_mapping)
        nd = md.num_decodes
        if nd and nd == q.shape[0]:
            return self._decode(layer, q)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._decode(layer, q[:nd])
        for p in self.prefills:
            rows = slice(p.q_start, p.q_start + p.q_len)
            out[rows] = self._prefill(layer, p, q[rows], k[rows], v[rows])
        return out

    def _prefill(self, layer: int, p: PrefillPlan, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """Attention of one prefill chunk (its q, k, v rows) over its cached keys and its own."""
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        hk, width, d = kc.shape[2], kc.shape[3], q.shape[2]
        if p.blocks is None:
            keys, vals = k, v
        else:
            keys = reference.read_cache_rows(kc[p.blocks].view(-1, hk, width)[: p.seq_len], d,
                                             q.dtype)
            vals = reference.read_cache_rows(vc[p.blocks].view(-1, hk, width)[: p.seq_len], d,
                                             q.dtype)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys.to(q.dtype).transpose(0, 1).unsqueeze(0),
            vals.to(q.dtype).transpose(0, 1).unsqueeze(0),
            attn_mask=p.mask,
            is_causal=p.mask is None,
            scale=self.scale,
            enable_gqa=q.shape[1] > hk,
        )
        return o.squeeze(0).transpose(0, 1)

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of the step's decodes (q [Bd, Hq, D], one row per sequence)."""
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        bd, hq, d = q.shape
        hk, width, n = kc.shape[2], kc.shape[3], self._decode_len
        # [Bd, blocks, block_size, Hk, W] -> [Bd, Hk, n, D]
        keys = reference.read_cache_rows(kc[self._decode_blocks].view(bd, -1, hk, width)[:, :n],
                                         d, q.dtype).permute(0, 2, 1, 3)
        vals = reference.read_cache_rows(vc[self._decode_blocks].view(bd, -1, hk, width)[:, :n],
                                         d, q.dtype).permute(0, 2, 1, 3)
        qg = q.view(bd, hk, hq // hk, d)  # the group's query heads act as a query length
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=self._decode_mask,
                                           scale=self.scale)
        return o.reshape(bd, hq, d)

"""Attention over the paged KV cache: per-step metadata and the torch (CPU) backend."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels import reference


@dataclass
class PrefillSpan:
    """One sequence with more than one new token in this step."""

    q_start: int
    q_len: int
    ctx_len: int  # cached tokens plus this step's
    slots: torch.Tensor | None  # flat cache slots of all ctx_len tokens; None when ctx_len == q_len
    mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when plainly causal


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    decode_rows: torch.Tensor  # [Bd] rows of q that are single-token (decode) queries
    decode_slots: torch.Tensor  # [Bd, L] flat cache slots to read, padded
    decode_mask: torch.Tensor  # [Bd, 1, 1, L] True where the key is real
    decode_block_tables: torch.Tensor | None = None  # [Bd, max_blocks] int64, for paged kernels
    decode_seq_lens: torch.Tensor | None = None  # [Bd] int64
    prefills: list[PrefillSpan] = field(default_factory=list)
    # The varlen view that the Triton kernels and the reference use.
    block_tables: torch.Tensor | None = None  # [B, max_blocks]
    seq_lens: torch.Tensor | None = None  # [B]
    query_start_loc: torch.Tensor | None = None  # [B+1]

    @property
    def num_decodes(self) -> int:
        return int(self.decode_rows.shape[0])


class TorchAttention:
    """Reference attention on any device: gathers each step's keys, then one SDPA call for
    all decodes (query heads folded per KV head, so GQA needs no repeat) and one per prefill."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float):
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.metadata: AttentionMetadata | None = None

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md = self.metadata
        assert md is not None
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        reference.write_kv_cache(k, v, kc, vc, md.slot_mapping)
        hq, hk, d = q.shape[1], kc.shape[2], kc.shape[3]
        group = hq // hk
        kflat, vflat = kc.view(-1, hk, d), vc.view(-1, hk, d)
        if md.num_decodes == q.shape[0] and md.num_decodes:
            return self._decode(q, kflat, vflat, md, group)
        out = torch.empty_like(q)
        if md.num_decodes:
            out[md.decode_rows] = self._decode(q.index_select(0, md.decode_rows), kflat, vflat, md, group)
        for span in md.prefills:
            qs = q[span.q_start : span.q_start + span.q_len]
            if span.slots is None:
                keys = k[span.q_start : span.q_start + span.q_len]
                vals = v[span.q_start : span.q_start + span.q_len]
            else:
                keys, vals = kflat[span.slots], vflat[span.slots]
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1).unsqueeze(0),
                keys.to(q.dtype).transpose(0, 1).unsqueeze(0),
                vals.to(q.dtype).transpose(0, 1).unsqueeze(0),
                attn_mask=span.mask,
                is_causal=span.mask is None,
                scale=self.scale,
                enable_gqa=group > 1,
            )
            out[span.q_start : span.q_start + span.q_len] = o.squeeze(0).transpose(0, 1)
        return out

    def _decode(self, q, kflat, vflat, md: AttentionMetadata, group: int) -> torch.Tensor:
        bd, hq, d = q.shape
        hk = hq // group
        keys = kflat[md.decode_slots].to(q.dtype).permute(0, 2, 1, 3)  # [Bd, hk, L, d]
        vals = vflat[md.decode_slots].to(q.dtype).permute(0, 2, 1, 3)
        qg = q.view(bd, hk, group, d)  # the group's query heads act as a query length
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=md.decode_mask, scale=self.scale)
        return o.reshape(bd, hq, d)

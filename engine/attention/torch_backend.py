"""The torch attention backend: the reference on any device, and the fallback on a CPU
without a C++ compiler.

It reads keys and values through the block tables like the kernels do, gathering whole
cache blocks: one batched gather and one SDPA call for all decodes (the group's query heads
folded into a query length, so GQA needs no repeat), and one per prefill, whose causal mask
is offset by the tokens already cached. What the gathers need is derived once per step and
KV cache group, in set_metadata, not once per layer. A sliding-window layer gathers only the
blocks its window reaches; a layer with sinks (gpt-oss) computes its softmax itself, since
SDPA has no sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from officellm.engine.attention.backend import AttentionMetadata, LayerAttention
from officellm.kernels.ops import ApplyRotary
from officellm.kernels.reference import reference


@dataclass
class PrefillPlan:
    """One prefill sequence of the step, as the torch backend runs it for one KV group."""

    q_start: int
    q_len: int
    seq_len: int  # cached tokens plus this step's
    first_key: int  # the position of the first key gathered (a window's first block)
    blocks: torch.Tensor | None  # the blocks holding keys [first_key, seq_len); None: all are this step's
    mask: torch.Tensor | None  # [q_len, keys] bool; None when plainly causal
    table: torch.Tensor | None = None  # the sequence's whole block table up to seq_len
    bidirectional: bool = False  # the mask lets some queries see later keys (an image's)


@dataclass
class DecodePlan:
    """The step's decodes for one KV group: the blocks gathered per sequence, and which of
    their keys each one sees."""

    blocks: torch.Tensor  # [Bd, n] block ids
    mask: torch.Tensor  # [Bd, 1, 1, n * block_size] bool
    length: int  # keys gathered per sequence (n * block_size, or the longest context)


class TorchAttention:
    """Reference paged attention with torch ops (SDPA), after `rotary` (the model's
    KernelOps.apply_rotary) and the reference's KV write."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 scale: float, rotary: ApplyRotary, layers: Sequence[LayerAttention]) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.rotary = rotary
        self.layers = list(layers)
        self.block_size = k_caches[0].shape[1]
        # One window per group (a group is the layers of one window).
        self.group_windows: dict[int, int | None] = {}
        for info in self.layers:
            self.group_windows[info.group] = info.window
        self.metadata: AttentionMetadata | None = None
        self.prefills: dict[int, list[PrefillPlan]] = {}
        self.decodes: dict[int, DecodePlan] = {}

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take the step's metadata and derive each group's decode gather and prefill plans."""
        self.metadata = metadata
        for group, window in self.group_windows.items():
            self._plan_decodes(metadata, group, window)
            self.prefills[group] = self._plan_prefills(metadata, group, window)

    def _plan_decodes(self, md: AttentionMetadata, group: int, window: int | None) -> None:
        nd = md.num_decodes
        if not nd:
            return
        bs = self.block_size
        tables = md.block_tables[group, :nd]
        lens = md.seq_lens[:nd].long()
        longest = max(md.seq_lens_host[:nd])
        if window is None:
            # Gather only as many blocks as the longest decode needs, and keys up to its
            # length (shorter sequences are masked), so the batch is no wider than its
            # longest context.
            keys = torch.arange(longest, device=lens.device)
            seen = keys < lens[:, None]
            self.decodes[group] = DecodePlan(tables[:, : -(-longest // bs)],
                                             seen[:, None, None, :], longest)
            return
        # Each sequence from the block holding its window's first key: a window's worth of
        # blocks, whatever the context (the blocks before it may be the null block).
        n = -(-window // bs) + 1
        first = (lens - window).clamp(min=0) // bs  # [Bd]
        cols = first[:, None] + torch.arange(n, device=lens.device)
        blocks = torch.gather(tables, 1, cols.clamp(max=tables.shape[1] - 1))
        pos = cols[:, :, None] * bs + torch.arange(bs, device=lens.device)  # [Bd, n, bs]
        pos = pos.reshape(nd, -1)
        seen = (pos < lens[:, None]) & (pos > lens[:, None] - 1 - window)
        self.decodes[group] = DecodePlan(blocks, seen[:, None, None, :], n * bs)

    def _plan_prefills(self, md: AttentionMetadata, group: int,
                       window: int | None) -> list[PrefillPlan]:
        plans = []
        qsl, lens, bs = md.query_start_loc_host, md.seq_lens_host, self.block_size
        dev = md.block_tables.device
        for b in range(md.num_decodes, md.num_seqs):
            start, n, ctx = qsl[b], qsl[b + 1] - qsl[b], lens[b]
            if n == 0:
                continue
            first_key = 0
            if window is not None:
                first_key = max(0, ctx - n - window + 1) // bs * bs
            q_pos = torch.arange(ctx - n, ctx, device=dev).unsqueeze(1)
            k_pos = torch.arange(first_key, ctx, device=dev).unsqueeze(0)
            spans = md.bidirectional[b] if md.bidirectional is not None else []
            if ctx == n and not spans:  # nothing cached before it: its own keys, causal
                mask = None if window is None else (k_pos <= q_pos) & (k_pos > q_pos - window)
                plans.append(PrefillPlan(start, n, ctx, 0, None, mask))
                continue
            # A chunk with a two-way span reads its keys back from the cache even when they
            # are all its own: the Triton backend runs such chunks through this path after
            # its kernel has written (and rotated) them.
            mask = _allowed(q_pos, k_pos, window, spans)
            table = md.block_tables[group, b, : -(-ctx // bs)]
            plans.append(PrefillPlan(start, n, ctx, first_key, table[first_key // bs:], mask,
                                     table, bool(spans)))
        return plans

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate q/k, store k/v in the layer's cache, then attend (see
        AttentionBackend.forward)."""
        md = self.metadata
        assert md is not None, "set_metadata before forward"
        info = self.layers[layer]
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        q, k = self.rotary(q, k, cos, sin)
        reference.write_kv_cache(k, v, kc, vc, md.slot_mapping[info.group])
        nd = md.num_decodes
        if nd and nd == q.shape[0]:
            return self._decode(layer, q)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._decode(layer, q[:nd])
        for p in self.prefills[info.group]:
            rows = slice(p.q_start, p.q_start + p.q_len)
            out[rows] = self._prefill(layer, p, q[rows], k[rows], v[rows])
        return out

    def cached_prefill(self, layer: int, p: PrefillPlan, q: torch.Tensor) -> torch.Tensor:
        """Attention of one prefill chunk's rotated q rows over keys and values already in
        the layer's cache (a plan with blocks): how another backend runs a chunk whose mask
        its kernel lacks (an image's two-way span)."""
        assert p.blocks is not None
        return self._prefill(layer, p, q, q, q)

    def _prefill(self, layer: int, p: PrefillPlan, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """Attention of one prefill chunk (its q, k, v rows) over its cached keys and its own."""
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        hk, width, d = kc.shape[2], kc.shape[3], q.shape[2]
        if p.blocks is None:
            keys, vals = k, v
        else:
            count = p.seq_len - p.first_key
            keys = reference.read_cache_rows(kc[p.blocks].view(-1, hk, width)[:count], d,
                                             q.dtype)
            vals = reference.read_cache_rows(vc[p.blocks].view(-1, hk, width)[:count], d,
                                             q.dtype)
        return _attend(q.transpose(0, 1).unsqueeze(0),
                       keys.to(q.dtype).transpose(0, 1).unsqueeze(0),
                       vals.to(q.dtype).transpose(0, 1).unsqueeze(0),
                       p.mask, self.scale, self.layers[layer].sinks).squeeze(0).transpose(0, 1)

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of the step's decodes (q [Bd, Hq, D], one row per sequence)."""
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        plan = self.decodes[self.layers[layer].group]
        bd, hq, d = q.shape
        hk, width, n = kc.shape[2], kc.shape[3], plan.length
        # [Bd, blocks, block_size, Hk, W] -> [Bd, Hk, n, D]
        keys = reference.read_cache_rows(kc[plan.blocks].view(bd, -1, hk, width)[:, :n],
                                         d, q.dtype).permute(0, 2, 1, 3)
        vals = reference.read_cache_rows(vc[plan.blocks].view(bd, -1, hk, width)[:, :n],
                                         d, q.dtype).permute(0, 2, 1, 3)
        qg = q.view(bd, hk, hq // hk, d)  # the group's query heads act as a query length
        o = _attend(qg, keys, vals, plan.mask, self.scale, self.layers[layer].sinks, hk)
        return o.reshape(bd, hq, d)


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None,
             spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Which keys each query sees: causal, or both in one bidirectional span
    (transformers' blockwise overlay), and within a sliding layer's window after that
    (Gemma 3's AND(window, OR(causal, block)))."""
    mask = k_pos <= q_pos
    for lo, hi in spans:
        mask |= (q_pos >= lo) & (q_pos < hi) & (k_pos >= lo) & (k_pos < hi)
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def _attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor | None,
            scale: float, sinks: torch.Tensor | None, fold: int = 0) -> torch.Tensor:
    """SDPA of q [B, Hq, Q, D] (or, with `fold` KV heads, [B, Hk, group * Q, D]: GQA's
    query heads folded into the query length) over keys/vals [B, Hk, K, D]; with sinks the
    softmax is computed here (sinks [Hq] join each row's denominator)."""
    if sinks is None:
        return F.scaled_dot_product_attention(
            q, keys, vals, attn_mask=mask, is_causal=mask is None and not fold, scale=scale,
            enable_gqa=not fold and q.shape[1] > keys.shape[1])
    b, h, rows, d = q.shape
    if fold:
        group = rows  # one decode row per query head of the KV head
        qh = q.reshape(b, fold, group, 1, d)  # [B, Hk, g, 1, D]
        kh, vh = keys.unsqueeze(2), vals.unsqueeze(2)  # [B, Hk, 1, K, D]
        sink = sinks.float().view(1, fold, group, 1, 1)
    else:
        rep = h // keys.shape[1]
        qh, kh = q.unsqueeze(2), keys.repeat_interleave(rep, 1).unsqueeze(2)
        vh = vals.repeat_interleave(rep, 1).unsqueeze(2)
        sink = sinks.float().view(1, h, 1, 1, 1)
    scores = (qh.float() @ kh.float().transpose(-1, -2)) * scale
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(
            scores.shape[-1] - scores.shape[-2])
    if mask.dim() == 4:  # [B, 1, 1, K]: the decode mask
        mask = mask.unsqueeze(2)
    scores = scores.masked_fill(~mask, float("-inf"))
    full = torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)
    probs = full.softmax(-1)[..., :-1]
    out = probs @ vh.float()
    return out.reshape(b, h, rows, d).to(q.dtype)

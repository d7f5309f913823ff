"""KV cache groups: layers of one attention type share a block table, and every group draws
its blocks from one pool (vLLM's hybrid KV-cache manager, as officellm does it).

A sliding-window layer (Gemma 3's five of every six, gpt-oss's every other) needs only its
window's keys: its blocks behind the window go back to the pool as the sequence grows, so
what a long chat costs is mostly its global layers. Layers are grouped by window; a group
holds at most `layers_per_block` layers, and a block id stands for one page in each of that
many cache tensors (tensor j holds the pages of the j-th layer of every group), so a block
is the same size whichever group takes it and one free list serves them all. A model with
one attention type (Llama, Qwen, Mixtral...) is one group of all its layers: one block table
per request, as before.

Which blocks a request of n tokens holds, per group, is said once here (`blocks_held`), and
the planner (engine/kv_plan.py), start-up sizing and the KV manager all count with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table: the same window (None: full attention)."""

    window: int | None
    layers: tuple[int, ...]


def first_needed_block(window: int | None, position: int, block_size: int) -> int:
    """The first block a query at `position` reads: 0 under full attention, else the block
    holding the oldest key of its window (position - window + 1)."""
    if window is None:
        return 0
    return max(0, position - window + 1) // block_size


@dataclass(frozen=True)
class KVCacheGroups:
    """The model's layers in KV cache groups, and how a block's pages map to layers."""

    groups: tuple[KVCacheGroup, ...]
    layers_per_block: int  # the pool's cache tensors: a block is a page in each

    @classmethod
    def for_windows(cls, windows: Sequence[int | None]) -> KVCacheGroups:
        """Group layers by their window (None: full attention), each group at most
        `layers_per_block` layers: the fewest layers of any window, or the most when every
        window has nearly as many (fewer unused pages in a group's last block)."""
        by_window: dict[int | None, list[int]] = {}
        for layer, window in enumerate(windows):
            by_window.setdefault(window, []).append(layer)
        counts = [len(v) for v in by_window.values()]
        size = min(counts)
        if max(counts) < 1.25 * size:
            size = max(counts)
        groups = []
        for window in sorted(by_window, key=lambda w: (w is not None, w or 0)):
            layers = by_window[window]
            for start in range(0, len(layers), size):
                groups.append(KVCacheGroup(window, tuple(layers[start:start + size])))
        return cls(tuple(groups), size)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_layers(self) -> int:
        return sum(len(g.layers) for g in self.groups)

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(g.window for g in self.groups)

    @property
    def uniform(self) -> bool:
        """One full-attention group: a block table per request, every block kept."""
        return len(self.groups) == 1 and self.groups[0].window is None

    def place(self, layer: int) -> tuple[int, int]:
        """(group, cache tensor) of a layer: its block table, and where its pages live."""
        for g, group in enumerate(self.groups):
            if layer in group.layers:
                return g, group.layers.index(layer)
        raise IndexError(f"layer {layer} is in no KV cache group")

    def blocks_held(self, num_tokens: int, block_size: int, chunk: int = 1) -> int:
        """Blocks a request of `num_tokens` tokens holds, all groups together, while a step
        computes its last `chunk` of them: a full group every block of its tokens, a sliding
        one those from the first query's window on."""
        if num_tokens <= 0:
            return 0
        total = -(-num_tokens // block_size)
        first = max(0, num_tokens - chunk)
        return sum(total - first_needed_block(g.window, first, block_size)
                   for g in self.groups)

    def max_tokens_in(self, num_blocks: int, block_size: int, chunk: int = 1) -> int:
        """The longest request (in whole blocks) that `num_blocks` blocks hold at once."""
        lo, hi = 0, num_blocks * block_size
        while lo < hi:  # blocks_held grows with the tokens
            mid = -(-(lo + hi) // 2)
            if self.blocks_held(mid, block_size, min(chunk, mid)) <= num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo // block_size * block_size

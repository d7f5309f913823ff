"""Random paged-attention problems (a shuffled block pool, block tables, varlen queries) and
their reference output: the inputs of the kernel tests and of gpu_check's kernel check."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedProblem:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks + 1, block_size, Hk, D]; the last block is the null one
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks], padded with the null block
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    scale: float

    @property
    def max_query_len(self) -> int:
        return int((self.query_start_loc[1:] - self.query_start_loc[:-1]).max())


def make_problem(seqs: list[tuple[int, int]], hq: int, hk: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, block_size: int = 16,
                 seed: int = 0) -> PagedProblem:
    """seqs: (context length, query length) per sequence; queries are the context's tail.

    Blocks are handed out in a shuffled order, so a kernel that assumed contiguous blocks
    would read the wrong keys; unused cache entries hold large values, so a kernel that read
    past a sequence's end would be visibly off.
    """
    g = torch.Generator().manual_seed(seed)
    need = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    shape = (num_blocks + 1, block_size, hk, head_dim)
    k_cache = (torch.randn(shape, generator=g) * 50).to(dtype)
    v_cache = (torch.randn(shape, generator=g) * 50).to(dtype)
    k_cache[-1] = 0
    v_cache[-1] = 0
    width = max(need)
    tables = torch.full((len(seqs), width), num_blocks, dtype=torch.long)
    for i, n in enumerate(need):
        ids = [perm.pop() for _ in range(n)]
        tables[i, :n] = torch.tensor(ids)
        # Real tokens get ordinary values; the unused tail of the last block keeps the 50s.
        for j, blk in enumerate(ids):
            filled = min(block_size, seqs[i][0] - j * block_size)
            k_cache[blk, :filled] = torch.randn(filled, hk, head_dim, generator=g).to(dtype)
            v_cache[blk, :filled] = torch.randn(filled, hk, head_dim, generator=g).to(dtype)
    q_lens = [q for _, q in seqs]
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    q = torch.randn(int(qsl[-1]), hq, head_dim, generator=g).to(dtype)
    return PagedProblem(
        q=q.to(device), k_cache=k_cache.to(device), v_cache=v_cache.to(device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device), scale=head_dim ** -0.5,
    )


def reference_output(p: PagedProblem, window: int | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    from officellm.kernels.reference import reference

    return reference.paged_attention(p.q.cpu(), p.k_cache.cpu(), p.v_cache.cpu(),
                                     p.block_tables.cpu(), p.seq_lens.cpu(),
                                     p.query_start_loc.cpu(), p.scale, window=window,
                                     sinks=None if sinks is None else sinks.cpu())


def hidden_by_window(p: PagedProblem, window: int) -> PagedProblem:
    """The problem with every block-table entry wholly before each sequence's first query's
    window pointing to the null block, as the engine may leave them, and that block's bytes
    all 0xFF: NaN in every cache dtype (an int8 row's scale included), so a kernel that read
    it at all, even for a key of weight 0, would return NaN. Compare a kernel's output on it
    with the reference on `p` (the reference reads whole sequences)."""
    import dataclasses

    block_size = p.k_cache.shape[1]
    null = p.k_cache.shape[0] - 1
    tables = p.block_tables.clone()
    q_lens = (p.query_start_loc[1:] - p.query_start_loc[:-1]).tolist()
    for b, (ctx, q_len) in enumerate(zip(p.seq_lens.tolist(), q_lens, strict=True)):
        first_visible = max(0, ctx - q_len - window + 1)
        tables[b, :first_visible // block_size] = null
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    for cache in (k_cache, v_cache):
        cache[null].view(torch.uint8).fill_(0xFF)
    return dataclasses.replace(p, k_cache=k_cache, v_cache=v_cache, block_tables=tables)


def stored_as(p: PagedProblem, cache_dtype: torch.dtype) -> tuple[PagedProblem, PagedProblem]:
    """(the problem with its caches stored in a one-byte cache_dtype, as the engine stores
    them: fp8 saturated, int8 rows with their scale; the same problem over the values that
    storage reads back, in q's dtype, for the reference)."""
    import dataclasses

    from officellm.kernels.reference import reference

    def store(cache: torch.Tensor) -> torch.Tensor:
        if cache_dtype == torch.int8:
            return reference.quantize_int8_rows(cache)
        return reference.to_cache_dtype(cache, cache_dtype)

    stored = dataclasses.replace(p, k_cache=store(p.k_cache), v_cache=store(p.v_cache))
    d = p.q.shape[-1]
    rounded = dataclasses.replace(
        p, k_cache=reference.read_cache_rows(stored.k_cache, d, p.q.dtype),
        v_cache=reference.read_cache_rows(stored.v_cache, d, p.q.dtype))
    return stored, rounded

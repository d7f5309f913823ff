"""A text's next-token log-probabilities through the engine's own model, KV cache and
attention backend, for the quality benchmarks (kv_cache_quality.py, fidelity.py).

Two ways, because a model is read two ways: `as_decodes` feeds the text one token per step,
as generation does (every key and value read back from the paged cache in its dtype, the
matmuls at one row: a CPU engine's GGUF blocks); `as_prefill` feeds it as one prompt of n
rows (the matmuls at n rows: `--quantization auto`'s dense weights where it keeps them).
Models of one attention type only (one KV cache group)."""

from __future__ import annotations

import torch


def _check_one_group(llm) -> None:
    groups = llm.llm_engine.engine_core.kv.groups
    if len(groups.groups) != 1:
        raise ValueError("teacher forcing here runs models of one attention type (one KV "
                         "cache group); this model has sliding-window layers")


def _metadata(first: int, count: int, blocks: torch.Tensor):
    from officellm.engine.attention.backend import AttentionMetadata

    end = first + count
    return AttentionMetadata(
        slot_mapping=torch.arange(first, end).unsqueeze(0), block_tables=blocks.unsqueeze(0),
        seq_lens=torch.tensor([end], dtype=torch.int32),
        query_start_loc=torch.tensor([0, count], dtype=torch.int32),
        num_decodes=1 if count == 1 else 0, max_query_len=count, seq_lens_host=[end],
        query_start_loc_host=[0, count])


@torch.inference_mode()
def as_decodes(llm, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] float32 log-probabilities of each next token, one decode per token."""
    _check_one_group(llm)
    core = llm.llm_engine.engine_core
    runner, model = core.runner, core.model
    blocks = torch.arange(-(-len(token_ids) // runner.block_size), dtype=torch.long).unsqueeze(0)
    rows = torch.zeros(1, dtype=torch.long)
    out = []
    for t, tok in enumerate(token_ids[:-1]):
        runner.attention.set_metadata(_metadata(t, 1, blocks))
        logits = model(torch.tensor([tok]), torch.tensor([t]), runner.attention, rows)
        out.append(torch.log_softmax(logits.float(), -1)[0])
    return torch.stack(out)


@torch.inference_mode()
def as_prefill(llm, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] float32 log-probabilities of each next token, the text one prompt."""
    _check_one_group(llm)
    core = llm.llm_engine.engine_core
    runner, model = core.runner, core.model
    n = len(token_ids) - 1
    blocks = torch.arange(-(-n // runner.block_size), dtype=torch.long).unsqueeze(0)
    runner.attention.set_metadata(_metadata(0, n, blocks))
    logits = model(torch.tensor(token_ids[:-1]), torch.arange(n), runner.attention,
                   torch.arange(n))
    return torch.log_softmax(logits.float(), -1)

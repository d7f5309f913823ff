"""Rotary position embedding tables, including rope_scaling (linear, llama3, yarn, longrope,
dynamic...), partial rotary (Phi-4-mini), a table per layer type (Gemma 3's sliding
layers rotate with another base than its global ones) and M-RoPE (Qwen2.5-VL: each token has
a temporal, height and width position, and each section of the frequencies turns by one of
them)."""

from __future__ import annotations

import torch

from officellm.engine.loading.model_spec import ModelSpec, RopeSpec
from officellm.engine.loading.transformers_lock import TRANSFORMERS


def rotary_dim(spec: ModelSpec) -> int:
    """Values of each head the rotary turns: head_dim, or its partial rotary share."""
    return spec.rotary_dim or spec.head_dim


def _default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _scaled_inv_freq(spec: ModelSpec, rope: RopeSpec, layer_type: str | None,
                     seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling through transformers' own rope functions (seq_len:
    LongRoPE's long factors past the original window)."""
    with TRANSFORMERS:
        from transformers import AutoConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        rtype = rope.scaling["rope_type"]  # type: ignore[index]
        if rtype not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"Unsupported rope_scaling type {rtype!r}; supported: "
                f"{', '.join(sorted(ROPE_INIT_FUNCTIONS))}."
            )
        # The model family's own config class normalizes rope settings across transformers versions.
        raw = {k: v for k, v in spec.raw.items() if k not in ("model_type", "transformers_version")}
        cfg = AutoConfig.for_model(spec.model_type, **raw)
        kwargs = {"layer_type": layer_type} if layer_type else {}
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rtype](cfg, torch.device("cpu"), seq_len=seq_len,
                                                       **kwargs)
        return inv_freq.float(), float(scaling)


def _table(inv_freq: torch.Tensor, scaling: float, max_positions: int,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(device), (emb.sin() * scaling).to(device)


class RotaryTable:
    """cos/sin for every position up to max_positions, in float32, as [P, rotary_dim].

    Values are computed exactly as transformers does (positions times inv_freq in float32,
    both halves concatenated, times the attention scaling), so a lookup by position equals
    its per-forward computation bit for bit.

    LongRoPE (Phi-3/Phi-4-mini) rotates a sequence past the original window with its long
    factors, every position of it: those rows follow the short ones, at `long_offset` +
    position (the runner adds the offset for such a sequence; engine/core/scheduler.py
    decides which, and recomputes a sequence's cache when it first grows past the window).
    """

    def __init__(self, spec: ModelSpec, rope: RopeSpec, max_positions: int,
                 device: torch.device, layer_type: str | None = None) -> None:
        dim = rotary_dim(spec)
        rtype = (rope.scaling or {}).get("rope_type", "default")
        self.long_offset = 0
        # M-RoPE: which of a token's three positions each column of cos/sin is read at.
        self.mrope_rows: torch.Tensor | None = None
        if spec.mrope_section is not None:
            self.mrope_rows = mrope_rows(spec.mrope_section, dim).to(device)
        if rtype == "default":
            self.cos, self.sin = _table(_default_inv_freq(rope.theta, dim), 1.0, max_positions,
                                        device)
            return
        # Dynamic NTK: transformers rescales only once a sequence passes the original
        # maximum; we keep the original frequencies (exact within that length).
        inv_freq, scaling = _scaled_inv_freq(spec, rope, layer_type)
        self.cos, self.sin = _table(inv_freq, scaling, max_positions, device)
        after = spec.long_context_after
        if rtype == "longrope" and after is not None:
            inv_long, scaling_long = _scaled_inv_freq(spec, rope, layer_type, after + 1)
            cos, sin = _table(inv_long, scaling_long, max_positions, device)
            self.long_offset = max_positions
            self.cos, self.sin = torch.cat([self.cos, cos]), torch.cat([self.sin, sin])

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, rotary_dim] at `positions` [T] (LongRoPE's long rows past
        long_offset), or at M-RoPE's [3, T] (temporal, height, width) positions: each column
        read at its section's row, as transformers' Qwen2.5-VL recomposes them. A token whose
        three positions are equal (all text) gets the plain table's row, so the runner sends
        [T] whenever a step holds no image token."""
        if positions.dim() == 1:
            return self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        assert self.mrope_rows is not None, "[3, T] positions for a model without M-RoPE"
        rows = self.mrope_rows.expand(positions.shape[1], -1).unsqueeze(0)
        cos = self.cos[positions].gather(0, rows).squeeze(0)
        sin = self.sin[positions].gather(0, rows).squeeze(0)
        return cos, sin


def mrope_rows(section: tuple[int, ...], dim: int) -> torch.Tensor:
    """For each of the `dim` columns of cos/sin, the row of the token's (temporal, height,
    width) positions it turns by: the frequencies (dim / 2, both halves alike) are cut into
    `section`'s parts, part i reading row i % 3 (transformers' recomposition_frequencies)."""
    if sum(section) * 2 != dim:
        raise ValueError(f"mrope_section {list(section)} does not cover a rotary of {dim} values.")
    half = torch.cat([torch.full((n,), i % 3, dtype=torch.long) for i, n in enumerate(section)])
    return torch.cat([half, half])

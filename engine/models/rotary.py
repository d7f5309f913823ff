"""Rotary position embedding tables, including rope_scaling (linear, llama3, yarn, dynamic...)."""

from __future__ import annotations

import torch

from officellm.engine.loading.model_spec import ModelSpec


def _default_inv_freq(spec: ModelSpec) -> torch.Tensor:
    d = spec.head_dim
    return 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def _scaled_inv_freq(spec: ModelSpec) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling through transformers' own rope functions."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rtype = spec.rope_scaling["rope_type"]  # type: ignore[index]
    if rtype not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"Unsupported rope_scaling type {rtype!r}; supported: "
            f"{', '.join(sorted(ROPE_INIT_FUNCTIONS))}."
        )
    # The model family's own config class normalizes rope settings across transformers versions.
    raw = {k: v for k, v in spec.raw.items() if k not in ("model_type", "transformers_version")}
    cfg = AutoConfig.for_model(spec.model_type, **raw)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rtype](cfg, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RotaryTable:
    """cos/sin for every position up to max_positions, in float32, as [P, head_dim].

    Values are computed exactly as transformers does (positions times inv_freq in float32,
    both halves concatenated, times the attention scaling), so a lookup by position equals
    its per-forward computation bit for bit.
    """

    def __init__(self, spec: ModelSpec, max_positions: int, device: torch.device) -> None:
        if spec.rope_scaling is None:
            inv_freq, scaling = _default_inv_freq(spec), 1.0
        else:
            # Dynamic NTK: transformers rescales only once a sequence passes the original
            # maximum; we keep the original frequencies (exact within that length).
            inv_freq, scaling = _scaled_inv_freq(spec)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * scaling).to(device)
        self.sin = (emb.sin() * scaling).to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)

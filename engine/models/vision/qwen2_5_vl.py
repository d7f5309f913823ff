"""Qwen2.5-VL's vision tower: the image processor's patches -> one row of the language
model's width per merged 2x2 patch (each image's placeholder tokens, in order).

The tower is transformers' own module (Qwen2_5_VisionTransformerPretrainedModel: the conv3d
patch embedding, the 2D rotary over each patch's row and column, window attention in most
layers and full attention in `fullatt_block_indexes`' layers, the MLP patch merger), given
the checkpoint's `visual.*` weights. Why not our own: the tower runs once per image, not
once per generated token, so it is a small share of a screenshot question's time next to
the language model's prefill over the image's tokens; its window permutation, its
cu_seqlens of windows and images and its rotary are intricate and easy to get subtly wrong;
and transformers' module gives the reference's numbers by construction (SDPA attention, as
transformers picks for the reference model). The engine's own code is where the per-token
cost is: the decoder, its paged KV cache and attention, with M-RoPE (engine/models/mrope.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from officellm.engine.loading.transformers_lock import TRANSFORMERS

if TYPE_CHECKING:
    from officellm.engine.multimodal.inputs import ImageFeature

# Where a checkpoint keeps the tower: transformers 5's saves, and the Qwen releases'.
_PREFIXES = ("model.visual.", "visual.")
# Qwen2VLImageProcessor's default largest image, in pixels (its max_pixels), and so the
# most tokens an image has: max_pixels / (14 * 14 px per patch) / (2 * 2 patches per token).
_MAX_PIXELS = 12845056


class Qwen2_5_VLVisionTower(nn.Module):
    """The tower of one Qwen2.5-VL checkpoint (engine.models.vision.VisionTower)."""

    # Qwen2.5-VL's image tokens attend causally, like text (no bidirectional span).
    bidirectional_images = False

    def __init__(self, config: dict[str, Any], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        with TRANSFORMERS:
            from transformers import AutoConfig
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
                Qwen2_5_VisionTransformerPretrainedModel,
            )

            raw = {k: v for k, v in config.items()
                   if k not in ("model_type", "transformers_version")}
            vision_config = AutoConfig.for_model("qwen2_5_vl", **raw).vision_config
            vision_config._attn_implementation = "sdpa"
            tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(vision_config,
                                                                          dtype=dtype)
        self.model = tower.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.merge = int(vision_config.spatial_merge_size)
        patch = int(vision_config.patch_size)
        self.max_tokens_per_image = _MAX_PIXELS // (patch * self.merge) ** 2
        self.dtype, self.device = dtype, device

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the checkpoint's `visual.*` tensors; how many. Raises ValueError for a tensor
        the tower does not have, or one of its own the checkpoint lacks."""
        own = self.model.state_dict()
        seen: set[str] = set()
        for name, tensor in weights:
            rest = next((name[len(p):] for p in _PREFIXES if name.startswith(p)), None)
            if rest is None or rest not in own:
                raise ValueError(f"Unexpected weight {name!r} in the Qwen2.5-VL checkpoint.")
            own[rest].copy_(tensor)
            seen.add(rest)
        missing = sorted(set(own) - seen)
        if missing:
            raise ValueError(f"The Qwen2.5-VL checkpoint lacks its vision tower's {missing[:5]}.")
        return len(seen)

    @torch.inference_mode()
    def encode(self, images: Sequence[ImageFeature]) -> list[torch.Tensor]:
        """Each image's rows [its placeholder tokens, hidden]: every image through the tower
        in one pass (each attends only to itself: the tower's cu_seqlens)."""
        grids = [image.grid_thw for image in images]
        assert all(g is not None for g in grids), "Qwen2.5-VL's images carry their grids"
        pixels = torch.cat([image.pixel_values for image in images]).to(self.device, self.dtype)
        grid_thw = torch.tensor(grids, dtype=torch.long, device=self.device)
        rows = self.model(pixels, grid_thw=grid_thw).pooler_output
        sizes = [t * h * w // self.merge ** 2 for t, h, w in grids]  # type: ignore[misc]
        return list(rows.split(sizes))

"""Qwen2.5-VL's vision tower: pixels of the image processor's patches -> one row of the
language model's width per merged 2x2 patch (each image's placeholder tokens, in order).

The tower is transformers' own module (Qwen2_5_VisionTransformerPretrainedModel: the conv3d
patch embedding, the 2D rotary over each patch's row and column, window attention in most
layers and full attention in `fullatt_block_indexes`' layers, the MLP patch merger), loaded
with the checkpoint's `visual.*` weights. Why not our own: the tower runs once per image, not
once per token, so its cost is a small part of a request's; its window permutation, the
cu_seqlens of windows and images and its rotary are intricate and easy to get subtly wrong,
and transformers' module gives the reference's numbers by construction. The engine's own
code is where the per-token cost is (the decoder, its KV cache and attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from officellm.engine.loading.model_loader import iter_safetensors
from officellm.engine.loading.transformers_lock import TRANSFORMERS

if TYPE_CHECKING:
    from officellm.engine.multimodal.inputs import ImageFeature

# Where a checkpoint keeps the tower: transformers 5's saves, and the Qwen releases'.
_PREFIXES = ("model.visual.", "visual.")


class Qwen2_5_VLVisionTower:
    """The tower of one Qwen2.5-VL checkpoint, on one device in one dtype."""

    def __init__(self, model_dir: str | Path, config: dict[str, Any], dtype: torch.dtype,
                 device: torch.device) -> None:
        with TRANSFORMERS:
            from transformers import AutoConfig
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
                Qwen2_5_VisionTransformerPretrainedModel,
            )

            raw = {k: v for k, v in config.items()
                   if k not in ("model_type", "transformers_version")}
            vision_config = AutoConfig.for_model("qwen2_5_vl", **raw).vision_config
            # sdpa: the attention transformers' model itself runs by default.
            vision_config._attn_implementation = "sdpa"
            tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(vision_config,
                                                                          dtype=dtype)
        weights = {}
        for name, tensor in iter_safetensors(Path(model_dir)):
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    weights[name[len(prefix):]] = tensor
        missing, unexpected = tower.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise ValueError(f"Qwen2.5-VL's vision tower in {model_dir}: missing weights "
                             f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}.")
        self.model = tower.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.merge = int(vision_config.spatial_merge_size)
        self.hidden_size = int(vision_config.out_hidden_size)
        self.dtype, self.device = dtype, device

    @torch.inference_mode()
    def encode(self, images: Sequence[ImageFeature]) -> list[torch.Tensor]:
        """Each image's rows [its placeholder tokens, hidden]: all of them through the tower
        in one pass (each image attends only to itself)."""
        grids = [image.grid_thw for image in images]
        assert all(g is not None for g in grids), "Qwen2.5-VL's images carry their grids"
        pixels = torch.cat([image.pixel_values for image in images]).to(self.device, self.dtype)
        grid_thw = torch.tensor(grids, dtype=torch.long, device=self.device)
        rows = self.model(pixels, grid_thw=grid_thw).pooler_output
        sizes = [t * h * w // self.merge ** 2 for t, h, w in grids]  # type: ignore[misc]
        return list(rows.split(sizes))

"""Qwen2.5-VL's prompt processing, as transformers' Qwen2_5_VLProcessor does it.

Qwen's chat template renders each image as <|vision_start|><|image_pad|><|vision_end|>; the
processor repeats that <|image_pad|> once per merged patch: grid_t * grid_h * grid_w /
merge_size^2 times, the grid being what the checkpoint's image processor (AutoImageProcessor:
Qwen2VLImageProcessor, which resizes to multiples of patch_size * merge_size = 28 px within
min_pixels..max_pixels, rescales and normalizes, and cuts 14-px patches, each image doubled
along time to the temporal patch of 2) made of the image. The expansion is done on token ids
(vLLM's way). An image's placeholder range is its <|image_pad|>s: the rows the vision tower
(qwen2_5_vl_tower.py) replaces, and the tokens whose M-RoPE positions are the patches' own
(engine/models/mrope.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from officellm.engine.loading.transformers_lock import TRANSFORMERS
from officellm.engine.multimodal.inputs import ImageFeature, ImageInputError, MultiModalPrompt
from officellm.engine.multimodal.processor import content_hash, count_markers

if TYPE_CHECKING:
    import torch
    from PIL import Image


class Qwen2_5_VLMultiModalProcessor:
    """Qwen2_5_VLProcessor's image-token expansion and image preprocessing
    (MultiModalProcessor)."""

    def __init__(self, model_dir: Path, config: dict[str, Any],
                 tokenizer: Any | None = None) -> None:
        """`tokenizer` is not needed: the expansion repeats a token id of the config."""
        with TRANSFORMERS:
            from transformers import AutoImageProcessor

            self.image_processor = AutoImageProcessor.from_pretrained(str(model_dir))
        self.image_token = int(config.get("image_token_id", 151655))
        self.merge = int(self.image_processor.merge_size)

    def process(self, token_ids: list[int], images: Sequence[Image.Image]) -> MultiModalPrompt:
        """See MultiModalProcessor.process: each <|image_pad|> becomes its image's tokens."""
        count_markers(token_ids, self.image_token, len(images))
        out: list[int] = []
        features: list[ImageFeature] = []
        pending = iter(images)
        for token in token_ids:
            if token != self.image_token:
                out.append(token)
                continue
            pixels, grid = self._pixels(next(pending))
            length = grid[0] * grid[1] * grid[2] // self.merge ** 2
            features.append(ImageFeature(len(out), length, content_hash(pixels, grid), pixels,
                                         grid))
            out.extend([self.image_token] * length)
        return MultiModalPrompt(out, tuple(features))

    def _pixels(self, image: Image.Image) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """The image processor's pixel_values for one image ([patches, 3 * 2 * 14 * 14]
        float32) and its patch grid (t, h, w)."""
        try:
            out = self.image_processor(images=[image], return_tensors="pt")
        except Exception as exc:  # the processor's own errors vary by image and backend
            raise ImageInputError(f"The image could not be processed: {exc}") from exc
        t, h, w = (int(x) for x in out["image_grid_thw"][0])
        return out["pixel_values"], (t, h, w)

"""Gemma 3's prompt processing, as transformers' Gemma3Processor does it.

Each <start_of_image> of the rendered chat becomes "\\n\\n<start_of_image>", then
mm_tokens_per_image <image_soft_token>s, then "<end_of_image>\\n\\n" (Gemma3Processor's
full_image_sequence); the image goes through the checkpoint's own image processor
(AutoImageProcessor: resized to the tower's square, rescaled, normalized; no pan-and-scan,
the processor's default). The expansion is done on token ids (vLLM's way): the newlines are
the tokenizer's ids for "\\n\\n". The image's placeholder range is its soft tokens, the rows the
tower's projected output replaces and the span its tokens attend across both ways.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from officellm.engine.loading.tokenizer import load_tokenizer
from officellm.engine.multimodal.inputs import ImageFeature, ImageInputError, MultiModalPrompt
from officellm.engine.multimodal.processor import content_hash, count_markers

if TYPE_CHECKING:
    from PIL import Image


class Gemma3MultiModalProcessor:
    """Gemma3Processor's expansion and image preprocessing (MultiModalProcessor)."""

    def __init__(self, model_dir: Path, config: dict[str, Any],
                 tokenizer: Any | None = None) -> None:
        from transformers import AutoImageProcessor

        self.boi = int(config["boi_token_index"])
        self.eoi = int(config["eoi_token_index"])
        self.image_token = int(config.get("image_token_index", config.get("image_token_id")))
        self.tokens_per_image = int(config.get("mm_tokens_per_image", 256))
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
        self.newlines: list[int] = tokenizer.encode("\n\n", add_special_tokens=False)
        self.image_processor = AutoImageProcessor.from_pretrained(str(model_dir))

    def process(self, token_ids: list[int], images: Sequence[Image.Image]) -> MultiModalPrompt:
        """See MultiModalProcessor.process."""
        count_markers(token_ids, self.boi, len(images))
        out: list[int] = []
        features: list[ImageFeature] = []
        pending = iter(images)
        for token in token_ids:
            if token != self.boi:
                out.append(token)
                continue
            out.extend(self.newlines)
            out.append(self.boi)
            offset = len(out)
            out.extend([self.image_token] * self.tokens_per_image)
            out.append(self.eoi)
            out.extend(self.newlines)
            pixels = self._pixels(next(pending))
            features.append(ImageFeature(offset, self.tokens_per_image,
                                         content_hash(pixels, None), pixels, None))
        return MultiModalPrompt(out, tuple(features))

    def _pixels(self, image: Image.Image) -> Any:
        """The image processor's pixel_values for one image: [1, 3, size, size] float32."""
        try:
            pixels = self.image_processor(images=[image], return_tensors="pt")["pixel_values"]
        except Exception as exc:  # the processor's own errors vary by image and backend
            raise ImageInputError(f"The image could not be processed: {exc}") from exc
        if pixels.shape[0] != 1:
            raise ImageInputError("The image processor made several crops of one image; "
                                  "pan-and-scan is not supported.")
        return pixels

"""A prompt with images, as the engine takes it: token ids with each image's placeholder
tokens expanded, and each image's preprocessed pixels where its placeholders are.

Plain dataclasses, torch-free at import (the server's process reads them without loading
torch until an image arrives): the pixel tensors are whatever the model's Hugging Face image
processor returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class ImageInputError(ValueError):
    """An image the model cannot take, or a prompt whose image markers do not match its
    images: the message is a sentence a client can read (the server answers 400 with it)."""


@dataclass(frozen=True)
class ImageFeature:
    """One image of a prompt.

    `offset`/`length`: the image's placeholder tokens are prompt positions
    [offset, offset + length): the rows the vision tower's output replaces, one per token.
    `content_hash`: sha256 hex of the preprocessed pixels with their shape and grid, so an
    identical image sent again hashes equal (the prefix cache's key for its blocks).
    `pixel_values`: as the model's image processor returns them for this image alone.
    `grid_thw`: Qwen2.5-VL's patch grid (t, h, w); None for models without one (Gemma 3).
    """

    offset: int
    length: int
    content_hash: str
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int] | None = None

    @property
    def end(self) -> int:
        """The position after the image's last placeholder token."""
        return self.offset + self.length


@dataclass(frozen=True)
class MultiModalPrompt:
    """A prompt's token ids (placeholders expanded: these ARE the prompt) and its images in
    prompt order, their placeholder ranges disjoint and inside the prompt."""

    token_ids: list[int]
    images: tuple[ImageFeature, ...]

    def __post_init__(self) -> None:
        end = 0
        for image in self.images:
            if image.offset < end or image.length <= 0 or image.end > len(self.token_ids):
                raise ValueError("A MultiModalPrompt's images must be in prompt order, each "
                                 "inside the prompt and apart from the others.")
            end = image.end

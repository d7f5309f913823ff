"""Where a prompt's images constrain the core: the rules that keep an image's placeholder
tokens in one prefill chunk and one prefix-cache hit, and the content hashes that key the
blocks an image overlaps. (An image's tokens attend to each other both ways in Gemma 3, so
all of them must be computed in the same forward; and a block's KV depends on the image's
pixels, not only on the placeholder ids, which are the same for every image.)"""

from __future__ import annotations

from collections.abc import Sequence

from officellm.engine.core.request import PromptImage


def clip_chunk(images: Sequence[PromptImage], start: int, num_new: int) -> int:
    """The tokens of a chunk [start, start + num_new) that leave no image cut: the chunk
    ends before an image that does not fit whole (0 when the chunk would start with it)."""
    end = start + num_new
    for image in images:
        if image.offset >= end:
            break
        if image.offset >= start and end < image.end:
            return image.offset - start
    return num_new


def image_chunk(images: Sequence[PromptImage], start: int, num_new: int, budget: int) -> int:
    """A prompt chunk of up to `num_new` tokens from `start` (what the step's budget and the
    prefill pacer allow) that cuts no image; when that leaves nothing because an image
    starting at `start` is longer than the pacer's room, the image alone if it fits the
    step's `budget`: else an image longer than what the pacer grants while others decode
    would never run."""
    fit = clip_chunk(images, start, num_new)
    if fit:
        return fit
    for image in images:
        if image.offset == start:
            return image.length if image.length <= budget else 0
    return 0


def hit_blocks_outside_images(images: Sequence[PromptImage], num_blocks: int,
                              block_size: int) -> int:
    """The most leading blocks (<= num_blocks) whose end is not inside an image: a cached
    prefix ends before an image or after it, never within it."""
    for image in reversed(images):
        if image.offset < num_blocks * block_size < image.end:
            num_blocks = image.offset // block_size
    return num_blocks


def block_image_hashes(images: Sequence[PromptImage], start: int, end: int) -> list[str]:
    """The content hashes of the images overlapping token positions [start, end)."""
    return [image.content_hash for image in images if image.offset < end and image.end > start]

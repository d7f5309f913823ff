"""The core's rules for a prompt's images (engine/core/image_ranges.py): a prefill chunk
never cuts an image, a prefix hit never ends inside one, and a block's key names the images
it holds placeholders of."""

from __future__ import annotations

from dataclasses import dataclass

from officellm.engine.core.image_ranges import (
    block_image_hashes,
    clip_chunk,
    hit_blocks_outside_images,
    image_chunk,
)


@dataclass(frozen=True)
class Image:
    offset: int
    length: int
    content_hash: str = "h"

    @property
    def end(self) -> int:
        return self.offset + self.length


IMAGES = (Image(20, 16, "a"), Image(40, 8, "b"))


def test_a_chunk_ends_before_an_image_that_does_not_fit_whole():
    assert clip_chunk(IMAGES, 0, 16) == 16  # ends before the first image
    assert clip_chunk(IMAGES, 16, 16) == 4  # would end inside it: stops at its start
    assert clip_chunk(IMAGES, 20, 16) == 16  # the image whole
    assert clip_chunk(IMAGES, 20, 10) == 0  # the image does not fit: nothing this step
    assert clip_chunk(IMAGES, 36, 100) == 100  # both images' ends are inside the chunk or past


def test_an_image_longer_than_the_pacers_room_runs_alone_within_the_budget():
    assert image_chunk(IMAGES, 20, 10, budget=64) == 16
    assert image_chunk(IMAGES, 20, 10, budget=12) == 0
    assert image_chunk(IMAGES, 16, 10, budget=64) == 4  # text before it goes first


def test_a_prefix_hit_backs_off_to_the_block_before_an_image_it_would_end_inside():
    assert hit_blocks_outside_images(IMAGES, 2, 16) == 1  # 32 is inside [20, 36)
    assert hit_blocks_outside_images(IMAGES, 3, 16) == 3  # 48 is the second image's end
    assert hit_blocks_outside_images((Image(40, 16),), 3, 16) == 2  # 48 inside [40, 56)
    assert hit_blocks_outside_images(IMAGES, 1, 16) == 1


def test_a_blocks_key_names_each_image_it_holds_placeholders_of():
    assert block_image_hashes(IMAGES, 16, 32) == ["a"]
    assert block_image_hashes(IMAGES, 32, 48) == ["a", "b"]
    assert block_image_hashes(IMAGES, 0, 16) == []

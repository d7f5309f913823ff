"""M-RoPE positions (Qwen2.5-VL): each prompt token's (temporal, height, width) position.

Text tokens have one position in all three rows, counting on from where the last text or
image left off. An image's placeholder tokens (one per merged patch, row by row) share the
temporal position where the image starts, and take the height and width of their patch in
the merged grid from there; the text after the image continues at that start plus the
grid's longer side. So a prompt with images ends at a smaller position than its length:
`delta` (the largest position + 1 - the prompt's length, 0 or less) is what every later
token adds to its index. transformers' Qwen2_5_VLModel.get_rope_index computes the same
(a still image's temporal step is 1); tests/engine/test_vision_qwen2_5_vl.py holds them
equal.

The rotary's cos/sin at these positions: RotaryTable.lookup (engine/models/rotary.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class GridImage(Protocol):
    """What the positions need of an image (engine/multimodal's ImageFeature has it)."""

    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def grid_thw(self) -> tuple[int, int, int] | None: ...


@dataclass(frozen=True)
class MRopePositions:
    """A prompt's positions [3, prompt length] int64, and the delta its later tokens add."""

    prompt: np.ndarray
    delta: int

    def at(self, start: int, count: int) -> np.ndarray:
        """Positions [3, count] of tokens start .. start + count - 1 (past the prompt:
        index + delta in every row)."""
        length = self.prompt.shape[1]
        if start + count <= length:
            return self.prompt[:, start:start + count]
        later = np.arange(max(start, length), start + count, dtype=np.int64) + self.delta
        head = self.prompt[:, start:length] if start < length else self.prompt[:, :0]
        return np.concatenate([head, np.broadcast_to(later, (3, later.size))], axis=1)


def mrope_positions(prompt_length: int, images: Sequence[GridImage],
                    spatial_merge_size: int) -> MRopePositions:
    """The positions of a prompt of `prompt_length` tokens whose images' placeholders lie at
    their offsets, each image's grid_thw counted in patches before the merge."""
    rows: list[np.ndarray] = []
    position = 0  # where the next text token or image starts
    text_from = 0
    for image in images:
        assert image.grid_thw is not None, "M-RoPE needs each image's patch grid"
        t, h, w = image.grid_thw
        h, w = h // spatial_merge_size, w // spatial_merge_size
        if t * h * w != image.length:
            raise ValueError(f"An image of grid {image.grid_thw} has {image.length} "
                             f"placeholder tokens, not {t * h * w}.")
        text = image.offset - text_from
        rows.append(np.broadcast_to(np.arange(text, dtype=np.int64) + position, (3, text)))
        position += text
        grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"))
        rows.append(grid.reshape(3, -1).astype(np.int64) + position)
        position += max(h, w)
        text_from = image.offset + image.length
    text = prompt_length - text_from
    rows.append(np.broadcast_to(np.arange(text, dtype=np.int64) + position, (3, text)))
    prompt = np.ascontiguousarray(np.concatenate(rows, axis=1))
    last = int(prompt.max()) if prompt.size else -1
    return MRopePositions(prompt, last + 1 - prompt_length)

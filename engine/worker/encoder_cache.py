"""The vision tower's outputs for the images a step's prompt chunks reach: encoded in one
batch per step (all requests' images together), kept per request image until the chunk that
computes its last placeholder token has run, then freed (a finished or aborted request's
are freed too).

The scheduler never splits an image across prefill chunks (engine/core/image_ranges.py), so
an image is encoded and consumed in the same step: nothing is held across steps, and a
preempted request that computes an image again encodes it again. The cache still takes
an image's rows in pieces, so that rule could be relaxed for a model whose images attend
causally.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from officellm.engine.models.decoder import ImageEmbeds
from officellm.engine.models.vision import VisionTower
from officellm.engine.multimodal.inputs import ImageFeature


@dataclass(frozen=True)
class ImageSlice:
    """Placeholder tokens of one image that a step computes: the image's rows
    [first, first + count) go to the step's flat token rows [row, row + count)."""

    request_id: str
    index: int  # the image's place among its request's images
    image: ImageFeature
    row: int
    first: int
    count: int


class EncoderCache:
    """A vision tower and its outputs still owed to placeholder tokens."""

    def __init__(self, tower: VisionTower) -> None:
        self.tower = tower
        self._outputs: dict[tuple[str, int], torch.Tensor] = {}
        self.images_encoded = 0  # images run through the tower (tests, stats)

    def embeds_for(self, slices: Sequence[ImageSlice], device: torch.device) -> ImageEmbeds:
        """The rows for a step's image slices, encoding the images not encoded yet in one
        tower call; an image's outputs are dropped once its last rows are handed out."""
        missing = {(s.request_id, s.index): s.image for s in slices
                   if (s.request_id, s.index) not in self._outputs}
        if missing:
            keys = list(missing)
            for key, out in zip(keys, self.tower.encode([missing[k] for k in keys])):
                self._outputs[key] = out
            self.images_encoded += len(keys)
        rows: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        for s in slices:
            key = (s.request_id, s.index)
            embeds.append(self._outputs[key][s.first:s.first + s.count])
            rows.append(torch.arange(s.row, s.row + s.count))
            if s.first + s.count == s.image.length:
                del self._outputs[key]
        return ImageEmbeds(torch.cat(rows).to(device), torch.cat(embeds))

    def release(self, request_ids: Iterable[str]) -> None:
        """Drop the outputs of requests that finished (or were aborted)."""
        gone = set(request_ids)
        if gone:
            for key in [k for k in self._outputs if k[0] in gone]:
                del self._outputs[key]

    @property
    def num_held(self) -> int:
        return len(self._outputs)

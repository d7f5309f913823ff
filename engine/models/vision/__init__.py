"""Vision towers: a multimodal checkpoint's image encoder and projector, which turn one
prompt's images into rows of the language model's input embeddings (engine/worker/
encoder_cache.py runs them; engine/multimodal/ makes their inputs).

Every model's tower implements `VisionTower`; `load_vision_tower` builds the one a
checkpoint's model_type names (VISION_TOWERS), or None for a model the engine serves text to.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from officellm.engine.multimodal.inputs import ImageFeature

# A checkpoint's model_type (config.json) -> "module:class" of its tower, each built as
# cls(config dict, dtype, device).
VISION_TOWERS: dict[str, str] = {
    "gemma3": "officellm.engine.models.vision.gemma3:Gemma3VisionTower",
}


class VisionTower(Protocol):
    """A model's image encoder and projector, as the model runner uses it."""

    # Whether an image's placeholder tokens attend to each other both ways in the language
    # model (Gemma 3's token_type_ids mask); else they are causal like text.
    bidirectional_images: bool
    # The most placeholder tokens one image can have: a step's token budget must hold it,
    # since an image is never split across prefill chunks.
    max_tokens_per_image: int

    def encode(self, images: Sequence[ImageFeature]) -> list[torch.Tensor]:
        """Each image's rows for its placeholder tokens: [image.length, text hidden size] in
        the language model's dtype, on its device (the images batched as the tower can)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the tower's and projector's tensors from the checkpoint's (name, tensor)
        pairs (the decoder hands over those it skips); how many were loaded. Raises
        ValueError for a tensor it does not know, or one missing at the end."""
        ...


def load_vision_tower(config: dict[str, Any], dtype: torch.dtype,
                      device: torch.device) -> VisionTower | None:
    """The tower of a checkpoint's config (config.json as a dict), its weights not yet
    loaded; None for a model without one here."""
    where = VISION_TOWERS.get(config.get("model_type", ""))
    if where is None:
        return None
    module, name = where.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(config, dtype, device)  # type: ignore[no-any-return]

"""The front end's way from (token ids with image markers, images) to a MultiModalPrompt,
per model: the Protocol every model's processor implements, the content hash, and
load_multimodal_processor (which model directory has which processor)."""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from officellm.engine.multimodal.inputs import ImageInputError, MultiModalPrompt

if TYPE_CHECKING:
    import torch
    from PIL import Image

# A checkpoint's model_type (config.json) -> "module:factory" of its processor; each factory
# takes the model directory, its config.json as a dict and the model's tokenizer (None: it
# loads it).
PROCESSORS: dict[str, str] = {
    "gemma3": "officellm.engine.multimodal.gemma3_processor:Gemma3MultiModalProcessor",
}


class MultiModalProcessor(Protocol):
    """A vision model's prompt processing, as its Hugging Face processor does it."""

    def process(self, token_ids: list[int], images: Sequence[Image.Image]) -> MultiModalPrompt:
        """Expand each image marker of `token_ids` (the chat template's rendering, each image
        one marker: Gemma 3's <start_of_image>) to the model's image tokens, and preprocess
        each image with the model's image processor. Raises ImageInputError when the markers
        and images differ in number or an image cannot be processed."""
        ...


def vision_model_type(model_dir: str | Path) -> str | None:
    """The model_type of a model directory whose images the engine can take (a family with a
    processor here, its image processor's config beside it: a Hugging Face checkpoint, not
    a GGUF's description), else None."""
    model_dir = Path(model_dir)
    config_file = model_dir / "config.json"
    if not config_file.is_file() or not (model_dir / "preprocessor_config.json").is_file():
        return None
    model_type = json.loads(config_file.read_text()).get("model_type", "")
    return model_type if model_type in PROCESSORS else None


def load_multimodal_processor(model_dir: str | Path,
                              tokenizer: Any | None = None) -> MultiModalProcessor | None:
    """The processor of a model directory's vision model; None when the model has no vision
    (vision_model_type's rule). `tokenizer`: the model's, when the caller has it loaded."""
    model_dir = Path(model_dir)
    model_type = vision_model_type(model_dir)
    if model_type is None:
        return None
    config = json.loads((model_dir / "config.json").read_text())
    where = PROCESSORS[model_type]
    module, name = where.split(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(model_dir, config, tokenizer)  # type: ignore[no-any-return]


def content_hash(pixel_values: torch.Tensor, grid_thw: tuple[int, int, int] | None) -> str:
    """sha256 hex of preprocessed pixels, their dtype, shape and grid: equal for the same
    image sent again (whatever its encoding on the way), different for any other."""
    import torch

    digest = hashlib.sha256()
    digest.update(f"{pixel_values.dtype}|{tuple(pixel_values.shape)}|{grid_thw}|".encode())
    raw = pixel_values.detach().cpu().contiguous().view(-1).view(torch.uint8)
    digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def count_markers(token_ids: list[int], marker: int, images: int) -> None:
    """Raise ImageInputError unless `token_ids` holds `marker` once per image."""
    found = token_ids.count(marker)
    if found != images:
        raise ImageInputError(
            f"The prompt has {found} image placeholder{'s' if found != 1 else ''} but "
            f"{images} image{'s' if images != 1 else ''} {'were' if images != 1 else 'was'} "
            "given: each image must appear once in the messages.")

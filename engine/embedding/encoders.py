"""Which encoder runs an embedding model directory, and the interface both offer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from officellm.engine.embedding.decoder_encoder import DecoderEncoder, pools_last_token
from officellm.engine.embedding.sentence_encoder import EncoderInfo, SentenceEncoder
from officellm.engine.loading.model_loader import load_config_dict
from officellm.engine.loading.model_spec import SUPPORTED_ARCHITECTURES


class Encoder(Protocol):
    """An embedding model the AsyncEmbedder runs."""

    model_dir: Path
    info: EncoderInfo

    def tokenize(self, text: str, max_length: int | None = None) -> list[int]: ...

    def encode(self, batch: list[list[int]]) -> torch.Tensor: ...

    def close(self) -> None:
        """Free what outlives the object (an embedding process); idempotent."""
        ...

    def watch(self, died: Callable[[str], None]) -> None:
        """Call `died(cause)` if the encoder stops untold (its process killed): never for
        one in this process."""
        ...


def load_encoder(model_dir: str | Path, device: str | None = None) -> Encoder:
    """The engine's own model code for a decoder architecture it runs that pools the last
    token (Qwen3-Embedding); sentence-transformers for the rest (BERT-like encoders)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"Embedding model {path} not found: give a sentence-"
                                "transformers directory or a decoder embedding model's Hugging "
                                "Face directory (Qwen3-Embedding).")
    try:
        model_type = load_config_dict(path).get("model_type")
    except (OSError, ValueError):
        model_type = None
    if model_type in SUPPORTED_ARCHITECTURES and pools_last_token(path):
        return DecoderEncoder(path, device)
    return SentenceEncoder(path, device)

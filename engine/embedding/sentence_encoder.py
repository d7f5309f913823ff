"""A sentence-transformers encoder (e.g. all-MiniLM-L6-v2): its own tokenizer, transformer,
pooling and normalisation, run by the sentence-transformers library, on token ids the caller
already has (so a batch is exactly its inputs, padded, and token-id input needs no text)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.embedding.locked_tokenizer import LockedTokenizer
from officellm.engine.loading.transformers_lock import TRANSFORMERS


@dataclass(frozen=True)
class EncoderInfo:
    """What a client may ask of an encoder."""

    dimensions: int  # the length of its vectors
    max_input_tokens: int  # the longest input it encodes (sentence-transformers' max_seq_length)
    matryoshka_dimensions: tuple[int, ...] | None  # shorter lengths it was trained for, if any
    normalized: bool  # whether its vectors have unit length
    vocab_size: int  # token ids it knows: 0 to vocab_size - 1


def matryoshka_dimensions(model_dir: Path, dimensions: int) -> tuple[int, ...] | None:
    """The Matryoshka lengths the model's config declares (`matryoshka_dimensions`, or
    `is_matryoshka`: any length up to its own), as vLLM reads them; None if it declares none."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    declared = config.get("matryoshka_dimensions")
    if isinstance(declared, list) and declared:
        return tuple(sorted({int(d) for d in declared if 0 < int(d) <= dimensions}))
    if config.get("is_matryoshka"):
        return tuple(range(1, dimensions + 1))
    return None


class SentenceEncoder:
    """One sentence-transformers model directory, loaded on `device` (default: the first GPU
    if torch sees one, else the CPU)."""

    def __init__(self, model_dir: str | Path, device: str | None = None) -> None:
        with TRANSFORMERS:
            from sentence_transformers import SentenceTransformer
            from sentence_transformers.models import Normalize

            self.model_dir = Path(model_dir)
            if not (self.model_dir / "modules.json").is_file():
                raise FileNotFoundError(f"{self.model_dir} is not an embedding model officellm "
                                        "runs: no sentence-transformers modules.json, and not a "
                                        "decoder architecture that pools its last token")
            if device is None:
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = SentenceTransformer(str(self.model_dir), device=device)
            self.model.eval()
            self.tokenizer = LockedTokenizer(self.model.tokenizer)
            dimensions = int(self.model.get_embedding_dimension())
            self.info = EncoderInfo(
                dimensions=dimensions,
                max_input_tokens=int(self.model.max_seq_length),
                matryoshka_dimensions=matryoshka_dimensions(self.model_dir, dimensions),
                normalized=any(isinstance(m, Normalize) for m in self.model),
                vocab_size=len(self.tokenizer))

    def tokenize(self, text: str, max_length: int | None = None) -> list[int]:
        """The ids sentence-transformers would encode for `text` (LockedTokenizer.tokenize)."""
        return self.tokenizer.tokenize(text, max_length)

    def close(self) -> None:
        """Nothing outlives the object: the model is freed with it."""

    def watch(self, died: Callable[[str], None]) -> None:
        """It runs in this process: it never stops untold."""

    @torch.inference_mode()
    def encode(self, batch: list[list[int]]) -> torch.Tensor:
        """One float32 vector per input, [len(batch), dimensions], the inputs padded together
        (each row attends only to its own tokens)."""
        features = self.tokenizer.pad(batch)
        device = self.model.device
        out = self.model({k: v.to(device) for k, v in features.items()})
        return out["sentence_embedding"].float().cpu()

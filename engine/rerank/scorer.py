"""What a reranker offers the AsyncReranker, whichever model runs it, and which one runs a
model directory: a cross-encoder (a *ForSequenceClassification checkpoint, run by
sentence-transformers) or a decoder reranker (a *ForCausalLM checkpoint in Qwen3-Reranker's
style, run on the engine)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from officellm.engine.config import EngineConfig


@dataclass(frozen=True)
class ScoredPair:
    """One document's relevance to its query, and the tokens the model read for the pair
    (after cutting a document past the model's limit)."""

    score: float
    tokens: int


@dataclass(frozen=True)
class RerankerInfo:
    """What a client may learn of a reranker."""

    max_input_tokens: int  # the longest query-document pair it reads; longer ones are cut
    scorer: str  # "cross-encoder" or "decoder"


class Scorer(Protocol):
    """A rerank model the AsyncReranker runs on its thread (never called concurrently)."""

    model_dir: Path
    info: RerankerInfo

    def score(self, pairs: list[tuple[str, str]]) -> list[ScoredPair]:
        """Each (query, document) pair's relevance, in order, the pairs run together."""
        ...

    def close(self) -> None:
        """Free what outlives the object; idempotent."""
        ...


def is_decoder_reranker(model_dir: Path) -> bool:
    """Whether the checkpoint is a causal LM (scored by its yes/no logit), by the
    architectures its config.json names; a cross-encoder names *ForSequenceClassification."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])


def load_scorer(model_dir: str | Path, device: str | None = None,
                engine_config: EngineConfig | None = None) -> Scorer:
    """The scorer for a rerank model directory: the engine for a decoder reranker (with
    `engine_config`'s knobs, its model set to the directory), sentence-transformers'
    CrossEncoder for the rest."""
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"Rerank model {path} not found: give a cross-encoder's or a "
                                "decoder reranker's (Qwen3-Reranker) Hugging Face directory.")
    if is_decoder_reranker(path):
        from officellm.engine.rerank.decoder_scorer import DecoderScorer

        return DecoderScorer(path, engine_config)
    from officellm.engine.rerank.cross_encoder_scorer import CrossEncoderScorer

    return CrossEncoderScorer(path, device)

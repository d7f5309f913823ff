"""A cross-encoder reranker (ms-marco-MiniLM, bge-reranker, mxbai-rerank-v1...): query and
document read together by a sequence-classification transformer, run by sentence-transformers'
CrossEncoder as its authors run it (its tokenizer, truncation and activation: a sigmoid for a
one-label model)."""

from __future__ import annotations

from pathlib import Path

import torch

from officellm.engine.loading.transformers_lock import TRANSFORMERS
from officellm.engine.rerank.scorer import RerankerInfo, ScoredPair


class CrossEncoderScorer:
    """One cross-encoder directory on `device` (default: the first GPU if torch sees one,
    else the CPU)."""

    def __init__(self, model_dir: str | Path, device: str | None = None) -> None:
        with TRANSFORMERS:
            from sentence_transformers import CrossEncoder

            self.model_dir = Path(model_dir)
            if device is None:
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = CrossEncoder(str(self.model_dir), device=device)
            self.model.eval()
        limit = self.model.max_seq_length
        if limit is None:
            limit = int(self.model.tokenizer.model_max_length)
        self.info = RerankerInfo(max_input_tokens=int(limit), scorer="cross-encoder")

    def score(self, pairs: list[tuple[str, str]]) -> list[ScoredPair]:
        """CrossEncoder.predict over all the pairs in one batch, and each pair's tokens as
        its tokenizer cuts them."""
        scores = self.model.predict([list(p) for p in pairs], batch_size=len(pairs),
                                    convert_to_tensor=True, show_progress_bar=False)
        lengths = self.model.tokenizer([q for q, _ in pairs], [d for _, d in pairs],
                                       truncation=True, max_length=self.info.max_input_tokens,
                                       verbose=False)["input_ids"]
        return [ScoredPair(float(s), len(ids))
                for s, ids in zip(scores.float().cpu().reshape(-1).tolist(), lengths,
                                  strict=True)]

    def close(self) -> None:
        """Nothing outlives the object: the model is freed with it."""

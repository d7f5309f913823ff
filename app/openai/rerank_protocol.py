"""The rerank and score APIs' requests and answers: Jina's and vLLM's `/v1/rerank` (and
`/rerank`), Cohere's `/v2/rerank`, and vLLM's `/score` (and `/v1/score`).

As on the other routes, unknown fields are ignored. `truncate_prompt_tokens` is accepted
and needs nothing: a pair longer than the model reads is always cut (its document's end),
as sentence-transformers and Qwen3-Reranker's card do.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from officellm.app.openai.answers import WireModel

# Documents in one request (Cohere's and Jina's limit is 1,000).
MAX_DOCUMENTS = 1000
# Cohere bills one search unit per query of up to 100 documents.
DOCUMENTS_PER_SEARCH_UNIT = 100


class TextDocument(BaseModel):
    """A document given as an object (Jina's and Cohere v1's shape)."""

    model_config = ConfigDict(extra="ignore")

    text: str


Document = str | TextDocument


class RerankRequest(BaseModel):
    """Jina's, vLLM's and Cohere's rerank request: the documents ranked by relevance to the
    query."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[Document] = Field(description=(
        f"Strings or {{\"text\": ...}} objects; 1 to {MAX_DOCUMENTS}."))
    top_n: int | None = Field(None, ge=0, description=(
        "Answer only the n most relevant (0 or none: all)."))
    return_documents: bool | None = Field(None, description=(
        "Echo each document in its result: by default on /v1/rerank and /rerank (Jina, "
        "vLLM), off on /v2/rerank (Cohere's v2 answers never hold them)."))
    truncate_prompt_tokens: int | None = None
    user: str | None = Field(None, description="As on chat: with a front-end key, the "
                                               "person the request is for; else ignored.")

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[Document]) -> list[Document]:
        if not value:
            raise ValueError("documents must not be empty")
        if len(value) > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS} documents in one request")
        return value

    def texts(self) -> list[str]:
        """Each document's text, in order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankDocument(WireModel):
    text: str


class RerankResult(WireModel):
    omit_unset = frozenset({"document"})

    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(WireModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(WireModel):
    """Jina's and vLLM's answer: the results most relevant first."""

    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class CohereApiVersion(WireModel):
    version: str = "2"


class CohereBilledUnits(WireModel):
    search_units: int


class CohereTokens(WireModel):
    input_tokens: int
    output_tokens: int = 0


class CohereMeta(WireModel):
    api_version: CohereApiVersion = Field(default_factory=CohereApiVersion)
    billed_units: CohereBilledUnits
    tokens: CohereTokens


class CohereRerankResponse(WireModel):
    """Cohere's v2 answer: the results most relevant first, and what was billed."""

    id: str
    results: list[RerankResult]
    meta: CohereMeta

    @staticmethod
    def meta_for(documents: int, tokens: int) -> CohereMeta:
        """Cohere's billing: a search unit per query of up to 100 documents."""
        return CohereMeta(billed_units=CohereBilledUnits(
                              search_units=math.ceil(documents / DOCUMENTS_PER_SEARCH_UNIT)),
                          tokens=CohereTokens(input_tokens=tokens))


Texts = str | list[str]


class ScoreRequest(BaseModel):
    """vLLM's score request: text_1 against each of text_2 (1:N), or pairwise (N:N)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    text_1: Texts
    text_2: Texts
    truncate_prompt_tokens: int | None = None
    user: str | None = None

    @field_validator("text_1", "text_2")
    @classmethod
    def _texts(cls, value: Texts) -> Texts:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("must not be empty")
        if len(items) > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS} texts in one request")
        return value

    def pairs(self) -> list[tuple[str, str]]:
        """The (query, document) pairs in order: one text_1 against every text_2, or the
        i-th against the i-th. ValueError for lists of different lengths."""
        first = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        second = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if len(first) == 1:
            return [(first[0], t) for t in second]
        if len(first) != len(second):
            raise ValueError(f"text_1 has {len(first)} texts and text_2 {len(second)}: give "
                             "one text_1, or as many as text_2 (scored pairwise).")
        return list(zip(first, second, strict=True))


class ScoreData(WireModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(WireModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(WireModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage

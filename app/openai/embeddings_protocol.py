"""POST /v1/embeddings: OpenAI's request and answer, with vLLM's `truncate_prompt_tokens`.

As on the other routes, unknown fields are ignored and a known one that cannot be honoured
is a 400 saying so: `dimensions` on a model not trained for shorter vectors (Matryoshka), an
input longer than the model reads unless `truncate_prompt_tokens` allows cutting it.
"""

from __future__ import annotations

import array
import base64
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from officellm.app.openai.answers import WireModel

# OpenAI's own limit on inputs in one request.
MAX_INPUTS = 2048

Input = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    input: Input = Field(description="A string, a list of strings, a list of token ids, or "
                                     f"a list of those lists; at most {MAX_INPUTS} inputs.")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's float32 values, little-endian, in base64.")
    dimensions: int | None = Field(None, ge=1, description=(
        "Shorter vectors, for models trained for them (Matryoshka); renormalised when the "
        "model's vectors have unit length."))
    user: str | None = Field(None, description="As on chat: with a front-end key, the "
                                               "person the request is for; else ignored.")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, description=(
        "vLLM's: cut each input to its first N tokens (-1: as many as the model reads), as "
        "sentence-transformers does, instead of refusing a longer input."))

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Input) -> Input:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_INPUTS and not all(isinstance(x, int) for x in items):
            raise ValueError(f"at most {MAX_INPUTS} inputs in one request")
        for item in items:
            if isinstance(item, (str, list)) and len(item) == 0:
                raise ValueError("an input must not be empty")
            if isinstance(item, list) and any(t < 0 for t in item):
                raise ValueError("token ids must not be negative")
        if isinstance(value, list) and isinstance(value[0], int) and any(t < 0 for t in value):
            raise ValueError("token ids must not be negative")
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be -1 (the model's limit) or at "
                             "least 1")
        return value

    def inputs(self) -> list[str | list[int]]:
        """Each input on its own: a text, or token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if all(isinstance(x, int) for x in value):
            return [list(value)]  # type: ignore[arg-type]
        return list(value)  # type: ignore[arg-type]


class EmbeddingData(WireModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(WireModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(WireModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as OpenAI answers it: a list of numbers, or base64 of its float32 values,
    little-endian (what the `openai` client decodes)."""
    if encoding_format == "base64":
        values = array.array("f", vector)
        if sys.byteorder == "big":
            values.byteswap()
        return base64.b64encode(values.tobytes()).decode("ascii")
    return vector

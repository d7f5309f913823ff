"""`--speculative-config` (vLLM's flag and names): which drafts the engine verifies."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram",)


@dataclass(frozen=True)
class SpeculativeConfig:
    """N-gram (prompt lookup) speculation: after each step a running sequence's last
    `prompt_lookup_max` down to `prompt_lookup_min` tokens are looked up earlier in its own
    prompt and output, and the up to `num_speculative_tokens` that followed there are
    verified in the next step's forward pass with its next token."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not built; officellm has "
                             f"{', '.join(METHODS)} (prompt lookup, no draft model).")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be 1 to 16.")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must be at least 1 and at most "
                             "prompt_lookup_max.")

    @classmethod
    def parse(cls, value: str | dict[str, Any] | SpeculativeConfig) -> SpeculativeConfig:
        """From the flag's JSON (or LLM()'s dict); ValueError naming what is wrong."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("--speculative-config is a JSON object, e.g. "
                             '{"method": "ngram", "num_speculative_tokens": 4}.')
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"--speculative-config: unknown field(s) {', '.join(unknown)}; "
                             f"it takes {', '.join(sorted(known))}.")
        if "prompt_lookup_max" in value and "prompt_lookup_min" not in value:
            value = {**value, "prompt_lookup_min": min(2, int(value["prompt_lookup_max"]))}
        return cls(**value)

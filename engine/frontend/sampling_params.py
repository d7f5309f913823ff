"""Per-request generation settings, in vLLM's shape, and the one declaration of their bounds.

BOUNDS is the only place a field's range is written down: SamplingParams.validate() walks it,
and the OpenAI request models (app/openai/protocol.py) copy it into their JSON schema as
documentation, so a request is checked once, here, whichever way it comes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from officellm.engine.structured_output.params import StructuredOutputsParams

MAX_TOP_LOGPROBS = 20
MAX_N = 16
# Integers the sampler hands to torch: a seed seeds a torch.Generator (64 bits) and top_k
# becomes an int64 tensor. Beyond these a request would fail inside the engine, and take the
# rest of its batch with it, instead of getting a 400.
SEED_RANGE = (-(2**63), 2**63 - 1)
MAX_TOP_K = 2**31 - 1


def _number(v: int | float) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _inexact(v: int | float) -> bool:
    """An integer a float cannot hold (beyond 2**53, most)."""
    return isinstance(v, int) and float(v) != v


@dataclass(frozen=True)
class Bound:
    """The allowed range of one numeric field: `minimum` (exclusive if `exclusive_minimum`)
    and `maximum`, either absent. `phrase` overrides the wording "must be <phrase>"."""

    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: bool = False
    phrase: str | None = None

    def contains(self, value: int | float) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.exclusive_minimum
                                         else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def describe(self) -> str:
        """What a valid value is, as in "n must be <this>"."""
        if self.phrase:
            return self.phrase
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            if self.exclusive_minimum:
                return f"in ({_number(lo)}, {_number(hi)}]"
            if isinstance(lo, int) and isinstance(hi, int):
                return f"between {lo} and {hi}"
            return f"in [{_number(lo)}, {_number(hi)}]"
        if lo is not None:
            if lo == 0:
                return "positive" if self.exclusive_minimum else "non-negative"
            return f"greater than {_number(lo)}" if self.exclusive_minimum \
                else f"at least {_number(lo)}"
        if hi is not None:
            return f"at most {_number(hi)}"
        return "any number"

    def json_schema(self) -> dict[str, Any]:
        """The bound in JSON Schema's words (minimum, exclusiveMinimum, maximum,
        exclusiveMaximum), each a number a float holds exactly: schemas pass through floats
        (FastAPI's OpenAPI models), and float(2**63 - 1) is 2**63, so seed's maximum is told
        as exclusiveMaximum 2**63."""
        out: dict[str, Any] = {}
        if self.minimum is not None:
            lo = self.minimum
            if self.exclusive_minimum:
                out["exclusiveMinimum"] = lo
            elif _inexact(lo) and not _inexact(lo - 1):
                out["exclusiveMinimum"] = lo - 1
            else:
                out["minimum"] = lo
        if self.maximum is not None:
            hi = self.maximum
            if _inexact(hi) and not _inexact(hi + 1):
                out["exclusiveMaximum"] = hi + 1
            else:
                out["maximum"] = hi
        return out


# Each field's bound, checked in this order (the first invalid field is the one reported).
BOUNDS: dict[str, Bound] = {
    "seed": Bound(*SEED_RANGE, phrase="a 64-bit integer"),
    "top_k": Bound(maximum=MAX_TOP_K),  # 0 or negative: disabled
    "n": Bound(1, MAX_N),
    "temperature": Bound(minimum=0.0),
    "top_p": Bound(0.0, 1.0, exclusive_minimum=True),
    "min_p": Bound(0.0, 1.0),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(minimum=0.0, exclusive_minimum=True),
    "max_tokens": Bound(minimum=1),
    "min_tokens": Bound(minimum=0),
    "logprobs": Bound(0, MAX_TOP_LOGPROBS),
    "prompt_logprobs": Bound(0, MAX_TOP_LOGPROBS),
}
# Float fields: NaN and infinities are refused before any bound is looked at.
FINITE_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


class SamplingParamsError(ValueError):
    """An invalid SamplingParams field: `field` names it; the message says what is allowed."""

    def __init__(self, field: str, message: str, bound: Bound | None = None,
                 value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.bound = bound
        self.value = value

    @classmethod
    def out_of_range(cls, field: str, bound: Bound, value: Any) -> SamplingParamsError:
        return cls(field, f"{field} must be {bound.describe()}, got {value}.", bound, value)

    def renamed(self, field: str) -> SamplingParamsError:
        """The same error told in the words of a caller whose field of that name fed this one
        (OpenAI's max_completion_tokens is SamplingParams' max_tokens)."""
        if field == self.field:
            return self
        if self.bound is not None:
            return self.out_of_range(field, self.bound, self.value)
        return SamplingParamsError(field, str(self), None, self.value)


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    temperature == 0 means greedy. `stop` strings are matched on the detokenized text and cut
    from the output; `stop_token_ids` end generation like EOS does. `logprobs=k` returns the
    chosen token's log-probability plus the top k alternatives (of the raw model distribution).
    `prompt_logprobs=k` does the same for each prompt token from the second on, given the
    tokens before it (vLLM's field: RequestOutput.prompt_logprobs, None for the first token);
    a request asking for them computes its whole prompt, taking nothing from the prefix cache.
    `structured_outputs` constrains the output to a schema, regex, choice or grammar
    (engine/structured_output/); logprobs stay those of the unconstrained distribution.
    `logprob_token_ids` (with `logprobs` set): each sampled position's entry also holds these
    tokens' raw logprobs, wherever they rank (a decoder reranker reads its "yes" and "no").
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        """Raise SamplingParamsError (a ValueError) naming the first invalid field."""
        for name in BOUNDS:
            if getattr(self, name) is None and name not in _OPTIONAL:
                raise SamplingParamsError(name, f"{name} must be a number, got None.")
        for name in FINITE_FIELDS:
            value = getattr(self, name)
            if not math.isfinite(value):
                raise SamplingParamsError(name, f"{name} must be a finite number, got {value}.",
                                          value=value)
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bound.contains(value):
                raise SamplingParamsError.out_of_range(name, bound, value)
        if self.logprob_token_ids and self.logprobs is None:
            raise SamplingParamsError("logprob_token_ids",
                                      "logprob_token_ids needs logprobs (0 or more).")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens",
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens}).",
                value=self.min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


# The fields that may be None (no seed, no max_tokens, no logprobs), from their annotations.
_OPTIONAL = frozenset(f.name for f in fields(SamplingParams) if "None" in str(f.type))

"""What a request's output must match: vLLM's StructuredOutputsParams, one kind per request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class StructuredOutputError(ValueError):
    """A structured-output spec that cannot be honoured: invalid, unsupported, or one that
    does not compile. The message says which part and why (it becomes the client's 400)."""


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of: a JSON schema (`json`, a dict or its JSON text), any JSON object
    (`json_object`), a regular expression, a list of choices, an EBNF grammar (xgrammar's
    dialect, GBNF-like), a Lark grammar (`lark`: the syntax of OpenAI's custom tools), or an
    xgrammar structural tag (JSON text; the server's tool calls use it). The engine
    constrains sampling so the output matches it."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    lark: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [name for name in KINDS if _is_set(getattr(self, name))]
        if len(given) != 1:
            raise StructuredOutputError(
                "Give exactly one structured-output constraint (one of "
                f"{', '.join(KINDS)}); got {', '.join(given) or 'none'}.")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise StructuredOutputError("choice must be a non-empty list of non-empty strings.")

    @property
    def kind(self) -> str:
        """Which constraint this is: one of KINDS."""
        return next(name for name in KINDS if _is_set(getattr(self, name)))

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema as a dict (None unless kind is json)."""
        if self.json is None:
            return None
        if isinstance(self.json, str):
            try:
                value = json.loads(self.json)
            except ValueError as exc:
                raise StructuredOutputError(f"The JSON schema is not valid JSON: {exc}.") from None
            if not isinstance(value, dict):
                raise StructuredOutputError("The JSON schema must be a JSON object.")
            return value
        return self.json

    def cache_key(self) -> str:
        """The same text for the same constraint: what compiled grammars are cached by."""
        value: Any = getattr(self, self.kind)
        if self.kind == "json":
            value = self.schema
        return json.dumps([self.kind, value], sort_keys=True, separators=(",", ":"))


KINDS = ("json", "json_object", "regex", "choice", "grammar", "lark", "structural_tag")


def _is_set(value: Any) -> bool:
    return value is not None and value is not False

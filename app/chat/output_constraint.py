"""What a request asks its output to be: OpenAI's response_format (text.format in the
Responses API), vLLM's structured_outputs and its older guided_* fields, all turned into one
engine StructuredOutputsParams.

A request names at most one constraint, whichever field it uses; two are refused (which
should win is anybody's guess, and guessing would silently break one of them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from officellm.app.chat.harmony import answer_format
from officellm.engine import StructuredOutputError, StructuredOutputsParams, check_json_schema


class JSONSchemaFormat(BaseModel):
    """response_format.json_schema: OpenAI's named schema (`strict` is honoured either way:
    the grammar always enforces the schema)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's `structured_outputs` request field. Unknown keys are refused: a constraint the
    server does not know is one it cannot honour."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None


@dataclass(frozen=True)
class Constraint:
    """The engine's spec and what to call it in metrics and the access log."""

    spec: StructuredOutputsParams
    kind: str  # json_schema | json_object | regex | choice | grammar | tool_required | tool_named

    @classmethod
    def of(cls, spec: StructuredOutputsParams) -> Constraint:
        kind = {"json": "json_schema", "structural_tag": "grammar", "lark": "grammar"}.get(spec.kind, spec.kind)
        return cls(spec, kind)

    def as_harmony_answer(self) -> Constraint:
        """The constraint on a gpt-oss turn: its analysis free, its final message's content
        constrained, as gpt-oss answers (a grammar from the first token would force the JSON
        where the model writes `<|channel|>`). A structural tag is the client's own shape of
        the whole output and stays as it is. StructuredOutputError for a JSON schema the
        engine does not support."""
        spec = self.spec
        if spec.kind == "structural_tag":
            return self
        if spec.kind == "json":
            schema = spec.schema
            check_json_schema(schema)
            content: dict[str, Any] = {"type": "json_schema", "json_schema": schema}
        elif spec.kind == "json_object":
            content = {"type": "json_schema",
                       "json_schema": {"type": "object", "additionalProperties": True}}
        elif spec.kind == "regex":
            content = {"type": "regex", "pattern": spec.regex}
        elif spec.kind == "choice":
            content = {"type": "or", "elements": [{"type": "const_string", "value": c}
                                                  for c in spec.choice or ()]}
        else:
            content = {"type": "grammar", "grammar": spec.grammar or spec.lark,
                       "syntax": "ebnf" if spec.kind == "grammar" else "lark"}
        tag = {"type": "structural_tag", "format": answer_format(content)}
        return Constraint(StructuredOutputsParams(structural_tag=json.dumps(tag)), self.kind)


def _spec(param: str, **kwargs: Any) -> tuple[str, StructuredOutputsParams]:
    try:
        return param, StructuredOutputsParams(**kwargs)
    except StructuredOutputError as exc:
        raise StructuredOutputError(f"{param}: {exc}") from None


def _format_spec(fmt: ResponseFormat, param: str) -> tuple[str, StructuredOutputsParams]:
    """The spec of a json_object or json_schema format; `param` names it in errors."""
    if fmt.type == "json_object":
        return _spec(param, json_object=True)
    schema = fmt.json_schema
    if schema is None or not schema.schema_:
        raise StructuredOutputError(f"{param} of type json_schema needs json_schema.schema.")
    return _spec(param, json=schema.schema_)


def format_constraint(fmt: ResponseFormat, param: str) -> Constraint | None:
    """The constraint of one OpenAI output format on its own (None for text): the Responses
    API's text.format, which has no other constraint field beside it. `param` names the
    field in errors."""
    return None if fmt.type == "text" else Constraint.of(_format_spec(fmt, param)[1])


def request_constraint(response_format: ResponseFormat | None,
                       structured_outputs: StructuredOutputsRequest | None,
                       guided: dict[str, Any]) -> Constraint | None:
    """The one constraint the request's fields name (None for none or response_format
    text). `guided` holds the guided_* fields by name. Raises StructuredOutputError (a 400)
    for two at once or an empty one."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    if response_format is not None and response_format.type != "text":
        found.append(_format_spec(response_format, "response_format"))
    if structured_outputs is not None:
        so = structured_outputs
        found.append(_spec("structured_outputs", json=so.json_, regex=so.regex,
                           choice=so.choice, grammar=so.grammar,
                           json_object=bool(so.json_object), structural_tag=so.structural_tag))
    names = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
             "guided_grammar": "grammar"}
    for field, kind in names.items():
        if guided.get(field) is not None:
            found.append(_spec(field, **{kind: guided[field]}))
    if len(found) > 1:
        raise StructuredOutputError(
            f"Give one output constraint; this request has {', '.join(p for p, _ in found)}.")
    return Constraint.of(found[0][1]) if found else None

"""Which JSON Schema keywords the grammar enforces, and the refusal of those it cannot.

xgrammar turns a schema into a grammar, but skips some validation keywords without a word
(measured on xgrammar 0.2.9: an output violating them is accepted). Silently producing
output that breaks the client's schema is worse than refusing it, so a schema that uses one
is refused, naming the keyword and where it is. `format` values xgrammar does not know stay
annotations, as JSON Schema 2020-12 defines `format` by default.
"""

from __future__ import annotations

from typing import Any

from officellm.engine.structured_output.params import StructuredOutputError

# Validation keywords xgrammar does not enforce.
UNSUPPORTED_KEYWORDS = frozenset({
    "uniqueItems", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "unevaluatedItems", "contentSchema", "$dynamicRef", "$recursiveRef",
})
# Keywords whose value is a schema, a list of schemas, or a map of names to schemas: where
# nested schemas are found.
_SCHEMA = ("items", "additionalProperties", "contains", "propertyNames",
           "unevaluatedProperties", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def check_json_schema(schema: Any, path: str = "#") -> None:
    """Raise StructuredOutputError for a schema (a dict) the grammar would not enforce."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"The JSON schema at {path} must be an object or a "
                                    f"boolean, not {type(schema).__name__}.")
    for keyword in sorted(UNSUPPORTED_KEYWORDS & schema.keys()):
        raise StructuredOutputError(
            f"The JSON schema keyword {keyword!r} (at {path}) is not supported for structured "
            "outputs: the output could not be guaranteed to satisfy it.")
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        # One entry (pydantic's way of adding a description to a $ref) is exact; several
        # are intersected by nothing.
        raise StructuredOutputError(
            f"The JSON schema keyword 'allOf' with more than one schema (at {path}) is not "
            "supported for structured outputs; merge them into one schema.")
    for keyword in _SCHEMA:
        if keyword in schema:
            check_json_schema(schema[keyword], f"{path}/{keyword}")
    for keyword in _SCHEMA_LISTS:
        value = schema.get(keyword)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                check_json_schema(sub, f"{path}/{keyword}/{i}")
    for keyword in _SCHEMA_MAPS:
        value = schema.get(keyword)
        if isinstance(value, dict):
            for name, sub in value.items():
                check_json_schema(sub, f"{path}/{keyword}/{name}")

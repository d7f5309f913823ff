"""The grammars a harmony model's plan gives the engine (a forced call, an output constraint)
compile with a tokenizer that has harmony's special tokens, and hold gpt-oss's own turns:
its analysis free, then the call or the answer in the shape it writes, each marker one
special token; then only its stop tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.chat.output_constraint import Constraint
from officellm.app.chat.tools import ChatTool, NamedToolChoice, ToolRequest
from officellm.engine import StructuredOutputsParams
from officellm.engine.structured_output.compiler import GrammarCompiler
from tests.support.harmony_model import GPT_OSS_TEMPLATE, harmony_tokenizer

WEATHER = ChatTool.model_validate({"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}})
FORMATS = ChatFormats.resolve(GPT_OSS_TEMPLATE.read_text(), "auto", "auto", True)
ANALYSIS = "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path):
    return harmony_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    return GrammarCompiler(tokenizer, len(tokenizer), stops)


def _holds(compiler: GrammarCompiler, tokenizer, spec: StructuredOutputsParams,
           text: str) -> bool:
    """Whether the grammar takes the text's tokens and then may end (a stop token)."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiler.compile(spec))
    ids = tokenizer.encode(text, add_special_tokens=False)
    stop = tokenizer.convert_tokens_to_ids("<|call|>")
    return all(matcher.accept_token(i) for i in ids) and matcher.accept_token(stop)


def _plan_spec(tools=None, constraint=None) -> StructuredOutputsParams:
    plan = FORMATS.plan(tools, constraint)
    assert plan.constraint is not None
    return plan.constraint.spec


CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris"}')


@pytest.mark.parametrize("text", [CALL, ANALYSIS + CALL], ids=["call", "analysis then call"])
def test_a_forced_call_takes_gpt_oss_call_with_or_without_its_analysis(compiler, tokenizer,
                                                                       text) -> None:
    named = NamedToolChoice.model_validate({"type": "function",
                                            "function": {"name": "get_weather"}})
    spec = _plan_spec(ToolRequest.of([WEATHER], named, True))
    assert _holds(compiler, tokenizer, spec, text)


def test_a_forced_call_refuses_arguments_off_the_schema(compiler, tokenizer) -> None:
    spec = _plan_spec(ToolRequest.of([WEATHER], "required", True))
    assert not _holds(compiler, tokenizer, spec, CALL.replace('"city"', '"town"'))


@pytest.mark.parametrize(("spec", "answer"), [
    (StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}},
                                   "required": ["n"]}), '{"n": 4}'),
    (StructuredOutputsParams(json_object=True), '{"any": ["thing"]}'),
    (StructuredOutputsParams(regex=r"\d+ apples"), "12 apples"),
    (StructuredOutputsParams(choice=["yes", "no"]), "no"),
    (StructuredOutputsParams(grammar='root ::= "a" "b"+'), "abbb"),
], ids=["json schema", "json object", "regex", "choice", "grammar"])
def test_an_output_constraint_holds_the_final_message_after_free_analysis(
        compiler, tokenizer, spec, answer) -> None:
    wrapped = _plan_spec(constraint=Constraint.of(spec))
    final = f"<|channel|>final<|message|>{answer}"
    assert _holds(compiler, tokenizer, wrapped, ANALYSIS + final)
    assert not _holds(compiler, tokenizer, wrapped, answer)  # the bare answer: not harmony


def test_a_structural_tag_is_the_clients_own_and_stays_as_given() -> None:
    tag = json.dumps({"type": "structural_tag", "format": {"type": "const_string",
                                                           "value": "hi"}})
    spec = StructuredOutputsParams(structural_tag=tag)
    assert _plan_spec(constraint=Constraint.of(spec)) is spec


def test_the_constraint_keeps_its_kind_for_metrics() -> None:
    plan = FORMATS.plan(None, Constraint.of(StructuredOutputsParams(regex="a")))
    assert plan.kind == "regex"

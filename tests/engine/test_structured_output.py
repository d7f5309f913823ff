"""Grammar-constrained decoding in the engine: outputs match their spec, constrained and free
rows share a batch without changing each other, and a grammar never hangs or fails a batch.

A 135M model answers badly; a grammar makes its output valid. These tests check validity,
and that constraining is deterministic (the same tokens alone or batched, chunked, preempted).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from officellm.engine import SamplingParams
from officellm.engine.structured_output import StructuredOutputError, StructuredOutputsParams
from tests.engine.conftest import make_llm


class Pet(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    tags: list[str] = Field(min_length=1, max_length=3)
    owner: str | None = None


PET = StructuredOutputsParams(json=Pet.model_json_schema())
ASK = [{"role": "user", "content": "Describe a pet as JSON."}]


def greedy(spec: StructuredOutputsParams | None = None, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 120)
    return SamplingParams(temperature=0.0, structured_outputs=spec, **kw)


def texts(llm, prompts, params) -> list[str]:
    return [o.outputs[0].text for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def prompts(smollm2_llm) -> list[list[int]]:
    chats = [ASK, [{"role": "user", "content": "Is the sky green? Answer."}],
             [{"role": "user", "content": "Give me a product code."}],
             [{"role": "user", "content": "Tell me about octopuses."}]]
    return [smollm2_llm.apply_chat_template(c) for c in chats]


def test_json_schema_output_validates_against_the_schema(smollm2_llm, prompts):
    out = smollm2_llm.generate(prompts[0], greedy(PET))[0].outputs[0]
    assert out.finish_reason == "stop"  # EOS came where the object was complete
    Pet.model_validate_json(out.text)


def test_json_object_output_is_a_json_object(smollm2_llm, prompts):
    text = texts(smollm2_llm, [prompts[0]], greedy(StructuredOutputsParams(json_object=True)))[0]
    assert isinstance(json.loads(text), dict)


def test_regex_output_matches_the_regex(smollm2_llm, prompts):
    pattern = r"[A-Z]{3}-[0-9]{4}"
    text = texts(smollm2_llm, [prompts[2]], greedy(StructuredOutputsParams(regex=pattern)))[0]
    assert re.fullmatch(pattern, text)


def test_choice_output_is_one_of_the_choices(smollm2_llm, prompts):
    choices = ["yes", "no", "it depends"]
    text = texts(smollm2_llm, [prompts[1]], greedy(StructuredOutputsParams(choice=choices)))[0]
    assert text in choices


def test_ebnf_grammar_output_is_in_the_language(smollm2_llm, prompts):
    grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+'
    text = texts(smollm2_llm, [prompts[3]],
                 greedy(StructuredOutputsParams(grammar=grammar), max_tokens=40))[0]
    # Complete, or cut by max_tokens: either way a prefix of the language.
    assert re.fullmatch(r"\([a-z]+(,[a-z]+)*\)?|\([a-z]*(,[a-z]*)*", text)


def test_lark_grammar_output_is_in_the_language(smollm2_llm, prompts):
    grammar = 'start: "(" item ("," item)* ")"\nitem: /[a-z]+/'
    text = texts(smollm2_llm, [prompts[3]],
                 greedy(StructuredOutputsParams(lark=grammar), max_tokens=40))[0]
    assert re.fullmatch(r"\([a-z]+(,[a-z]+)*\)?|\([a-z]*(,[a-z]*)*", text)


def test_mixed_batch_gives_each_request_its_output_alone(smollm2_dir, prompts):
    """Constrained and free rows in one batch, under chunked prefill and forced preemption:
    every output is the one the request gets alone (masks touch their own rows only)."""
    specs = [PET, None, StructuredOutputsParams(regex=r"[A-Z]{3}-[0-9]{4}"), None,
             StructuredOutputsParams(json_object=True), None]
    batch_prompts = [prompts[i % len(prompts)] for i in range(len(specs))]
    params = [greedy(s, max_tokens=20) for s in specs]
    alone_llm = make_llm(smollm2_dir)
    alone = [texts(alone_llm, [p], q)[0] for p, q in zip(batch_prompts, params)]
    # 12 blocks of 16 tokens for six ~60-token sequences: preemption is certain.
    tight = make_llm(smollm2_dir, kv_cache_memory=12 * 16 * 46080, max_num_batched_tokens=48,
                     enable_prefix_caching=False)
    batched = texts(tight, batch_prompts, params)
    assert tight.llm_engine.stats().num_preemptions_total > 0
    assert batched == alone


def test_logprobs_of_a_constrained_request_are_the_raw_distributions(smollm2_llm, prompts):
    free = smollm2_llm.generate(prompts[1], greedy(max_tokens=1, logprobs=1))[0].outputs[0]
    constrained = smollm2_llm.generate(
        prompts[1], greedy(StructuredOutputsParams(choice=["maybe"]), max_tokens=1,
                           logprobs=1))[0].outputs[0]
    top_free = free.token_ids[0]
    assert constrained.token_ids[0] != top_free  # the grammar chose another token ...
    # ... yet the model's own favourite and its logprob are reported unchanged.
    assert constrained.logprobs[0][top_free] == free.logprobs[0][top_free]


class BoundedPet(BaseModel):
    """A schema whose every document has a bounded length (strings capped, whitespace capped
    by the compiler), so a sample always ends: with Pet's free strings a temperature-1 sample
    can run on inside a string past any max_tokens, and whether it does depends on the CPU's
    float rounding."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    tags: list[Literal["small", "calm", "loud", "old", "young"]] = Field(min_length=1,
                                                                         max_length=3)


def test_seeded_samples_under_a_grammar_are_valid_and_reproducible(smollm2_llm, prompts):
    spec = StructuredOutputsParams(json=BoundedPet.model_json_schema())
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=600,
                            structured_outputs=spec)
    first = smollm2_llm.generate(prompts[0], params)[0].outputs
    again = smollm2_llm.generate(prompts[0], params)[0].outputs
    assert [o.text for o in first] == [o.text for o in again]
    for out in first:
        assert out.finish_reason == "stop", out.text
        BoundedPet.model_validate_json(out.text)


def test_a_grammar_that_admits_no_token_ends_the_request_with_stop(smollm2_llm, prompts, caplog):
    # After "no" only EOS is grammatical, and min_tokens forbids EOS: nothing is allowed.
    params = greedy(StructuredOutputsParams(choice=["no"]), min_tokens=5)
    with caplog.at_level(logging.WARNING, logger="officellm.engine.scheduler"):
        out = smollm2_llm.generate(prompts[1], params)[0].outputs[0]
    assert (out.text, out.finish_reason) == ("no", "stop")
    assert "grammar admits no token" in caplog.text


def test_identical_specs_compile_once(smollm2_llm):
    compiler = smollm2_llm.llm_engine.grammar_compiler
    spec = StructuredOutputsParams(regex=r"[0-9]{2}x")
    compiler.compile(spec)
    before = compiler.stats.compiles, compiler.stats.cache_hits
    compiler.compile(StructuredOutputsParams(regex=r"[0-9]{2}x"))
    assert (compiler.stats.compiles, compiler.stats.cache_hits) == (before[0], before[1] + 1)


@pytest.mark.parametrize(("spec", "message"), [
    (StructuredOutputsParams(regex="(("), "The regular expression does not compile"),
    (StructuredOutputsParams(grammar="root ::= missing"), "The grammar does not compile"),
    (StructuredOutputsParams(lark="start: missing"), "The Lark grammar does not compile"),
    (StructuredOutputsParams(json={"type": "strin"}), "The JSON schema does not compile"),
    (StructuredOutputsParams(json={"type": "array", "uniqueItems": True}),
     "keyword 'uniqueItems' (at #)"),
    (StructuredOutputsParams(json={"properties": {"a": {"not": {"type": "string"}}}}),
     "keyword 'not' (at #/properties/a)"),
    (StructuredOutputsParams(json="{oops"), "not valid JSON"),
])
def test_a_spec_that_cannot_be_honoured_is_refused_before_queueing(smollm2_llm, prompts, spec,
                                                                   message):
    with pytest.raises(StructuredOutputError, match=re.escape(message)):
        smollm2_llm.llm_engine.add_request("bad", prompts[0], greedy(spec))
    assert not smollm2_llm.llm_engine.has_unfinished_requests()


def test_a_spec_needs_exactly_one_constraint():
    with pytest.raises(StructuredOutputError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])

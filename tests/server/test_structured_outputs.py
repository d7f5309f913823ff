"""Structured outputs through the real server and the real `openai` client: response_format,
vLLM's structured_outputs and guided_* fields make the bundled model's output valid; a spec
that cannot be honoured is a 400 and the server goes on.

The 135M model answers badly; the grammar makes its answers parse. Validity is what is tested.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.policy.helpers import Admin
from tests.support.server_api import TIMEOUT, sample, scrape

ASK = [{"role": "user", "content": "Describe it as JSON."}]


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)


class Person(BaseModel):  # nested objects, an optional field
    name: str = Field(max_length=30)
    address: Address
    nickname: str | None = None


class Basket(BaseModel):  # arrays with min/max items, integer bounds
    items: list[str] = Field(min_length=1, max_length=3)
    count: int = Field(ge=1, le=9)


class Ticket(BaseModel):  # enums, a bounded number, a boolean
    priority: Literal["low", "normal", "high"]
    urgent: bool
    score: float = Field(ge=0, le=1)


@pytest.mark.parametrize("schema", [Person, Basket, Ticket])
def test_parse_returns_a_parsed_object(client: openai.OpenAI, model: str, schema) -> None:
    out = client.chat.completions.parse(model=model, messages=ASK, response_format=schema,
                                        temperature=0, max_tokens=120)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, schema)


@pytest.mark.parametrize("schema", [Person, Basket, Ticket])
def test_streamed_parse_returns_the_same_object(client: openai.OpenAI, model: str,
                                                schema) -> None:
    whole = client.chat.completions.parse(model=model, messages=ASK, response_format=schema,
                                          temperature=0, max_tokens=120)
    with client.chat.completions.stream(model=model, messages=ASK, response_format=schema,
                                        temperature=0, max_tokens=120) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == whole.choices[0].message.parsed


def test_json_object_mode_returns_a_json_object(client: openai.OpenAI, model: str) -> None:
    ask = [{"role": "user", "content": 'Reply with a JSON object with a single key "answer": '
                                       "what is 2+2?"}]
    out = client.chat.completions.create(model=model, messages=ask, temperature=0,
                                         max_tokens=120, response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_structured_outputs_regex_returns_matching_text(client: openai.OpenAI,
                                                        model: str) -> None:
    pattern = r"[A-Z]{2}-[0-9]{3}"
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A product code?"}], temperature=0,
        max_tokens=20, extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, out.choices[0].message.content)


def test_guided_choice_returns_one_of_the_choices(client: openai.OpenAI, model: str) -> None:
    choices = ["positive", "negative", "neutral"]
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "I love it! Sentiment?"}],
        temperature=0, max_tokens=10, extra_body={"guided_choice": choices})
    assert out.choices[0].message.content in choices


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


def test_completions_honour_response_format(client: openai.OpenAI, model: str) -> None:
    out = client.completions.create(model=model, prompt="Is Paris in France? As JSON:",
                                    temperature=0, max_tokens=40,
                                    extra_body={"response_format": {
                                        "type": "json_schema",
                                        "json_schema": {"name": "verdict",
                                                        "schema": Verdict.model_json_schema()}}})
    Verdict.model_validate_json(out.choices[0].text)


def _refusal(server, body: dict) -> dict:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers,
                   json={"messages": ASK, "max_tokens": 8, **body}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize(("body", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
     "The JSON schema keyword 'uniqueItems' (at #) is not supported"),
    ({"guided_regex": "(("}, "The regular expression does not compile"),
    ({"structured_outputs": {"grammar": "root ::= nothing"}}, "The grammar does not compile"),
    ({"structured_outputs": {"regex": "a", "lark": "x"}}, "lark"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "Give one output constraint"),
    ({"response_format": {"type": "json_schema"}}, "needs json_schema.schema"),
])
def test_a_spec_that_cannot_be_honoured_gets_a_400(server, client: openai.OpenAI, model: str,
                                                   body: dict, message: str) -> None:
    assert message in _refusal(server, body)["message"]
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
    assert out.choices[0].message.content is not None  # the next request is served


def test_structured_requests_are_counted_by_kind(server, client: openai.OpenAI,
                                                 model: str) -> None:
    def count() -> float:
        return sample(scrape(server), "officellm:structured_requests_total", kind="choice",
                      model_name=model)

    def admin_count() -> int:
        stats = Admin(server.base_url, server.db_path).get("/stats")
        return stats["structured_requests"].get("choice", 0)

    before, admin_before = count(), admin_count()
    client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                   extra_body={"guided_choice": ["a", "b"]})
    assert (count(), admin_count()) == (before + 1, admin_before + 1)


def _slow_schema(tag: str) -> dict:
    """A schema xgrammar takes seconds to compile on this vocabulary (300 patterned fields)."""
    fields = {f"{tag}_{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1},{i % 13 + 9}}}$"}
              for i in range(300)}
    return {"type": "object", "properties": fields, "required": list(fields)}


def _json_schema_body(schema: dict) -> dict:
    return {"messages": ASK, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "slow", "schema": schema}}}


def test_others_are_served_while_a_grammar_compiles(server, client: openai.OpenAI,
                                                    model: str) -> None:
    done: dict[str, float] = {}

    def slow() -> None:
        httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers,
                   json=_json_schema_body(_slow_schema("served")), timeout=TIMEOUT)
        done["slow"] = time.monotonic()

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(0.3)  # the slow request is compiling
    client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
    done["plain"] = time.monotonic()
    worker.join()
    assert done["plain"] < done["slow"]


def test_a_client_that_leaves_while_its_grammar_compiles_leaves_nothing_behind(
        server, client: openai.OpenAI, model: str) -> None:
    admin = Admin(server.base_url, server.db_path)
    finished = admin.get("/stats")["engine"]["num_requests_finished_total"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers,
                   json=_json_schema_body(_slow_schema("gone")), timeout=1.0)
    # The grammar finishes compiling after the client left: nothing reaches the engine, and
    # the request's slot and in-flight count are given back.
    start = time.monotonic()
    while sample(scrape(server), "officellm:requests_in_flight") and \
            time.monotonic() - start < TIMEOUT:
        time.sleep(0.2)
    assert sample(scrape(server), "officellm:requests_in_flight") == 0
    engine = admin.get("/stats")["engine"]
    assert (engine["num_running"], engine["num_waiting"]) == (0, 0)
    assert engine["num_requests_finished_total"] == finished
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
    assert out.choices[0].message.content is not None

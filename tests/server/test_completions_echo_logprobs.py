"""OpenAI's legacy scoring on /v1/completions, with the real `openai` client against a real
server: `echo` with `logprobs` returns the prompt's tokens and their logprobs (null for the
first) before the generated ones; `max_tokens: 0` with `echo` scores the prompt alone; and
lm-evaluation-harness's loglikelihood request (token ids, echo, logprobs=1, max_tokens=1)
gets what it reads."""

from __future__ import annotations

import httpx
import pytest

from officellm.engine import SamplingParams
from tests.support.openai_errors import openai_error
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess

PROMPT = "The three primary colors are red, yellow and"
# Server and offline engine run the same float32 model, in batches of their own.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def scored_prompt(reference_llm) -> tuple[list[int], list[float]]:
    """PROMPT's token ids and each token's logprob after the first, by the offline engine."""
    out = reference_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1,
                                                        prompt_logprobs=0))[0]
    ids = out.prompt_token_ids
    return ids, [out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i]


def assert_scores(token_logprobs: list[float | None], expected: list[float]) -> None:
    assert token_logprobs[0] is None
    assert token_logprobs[1:len(expected) + 1] == pytest.approx(expected, abs=TOLERANCE)


def test_echo_with_logprobs_gives_the_prompt_tokens_then_the_generated(client, model,
                                                                       scored_prompt):
    ids, expected = scored_prompt
    r = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=2,
                                  max_tokens=3, temperature=0)
    (choice,) = r.choices
    lp = choice.logprobs
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 3
    assert_scores(lp.token_logprobs, expected)
    assert lp.top_logprobs[0] is None
    assert all(len(top) >= 2 for top in lp.top_logprobs[1:])
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    # Offsets into choice.text: the prompt's tokens from 0, the answer's from the echo's end.
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(PROMPT)
    assert lp.text_offset == sorted(lp.text_offset)


def test_max_tokens_0_with_echo_scores_the_prompt_alone(client, model, scored_prompt):
    ids, expected = scored_prompt
    r = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1,
                                  max_tokens=0)
    (choice,) = r.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids)
    assert_scores(choice.logprobs.token_logprobs, expected)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)


def test_max_tokens_0_without_echo_is_refused_saying_why(server: ServerProcess, model):
    r = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers,
                   timeout=TIMEOUT, json={"model": model, "prompt": PROMPT, "max_tokens": 0})
    err = openai_error(r, 400)
    assert err["param"] == "max_tokens"
    assert "at least 1" in err["message"] and "echo" in err["message"]


def test_lm_eval_loglikelihood_request(server: ServerProcess, model, scored_prompt):
    """lm-evaluation-harness's `local-completions` loglikelihood: context and continuation as
    token ids in a batch, echo, logprobs=1, max_tokens=1, temperature 0; it reads the
    continuation's logprobs as token_logprobs[ctxlen:-1] and whether it is greedy from
    top_logprobs[ctxlen:-1]."""
    ids, expected = scored_prompt
    ctxlen = len(ids) - 3
    r = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers,
                   timeout=TIMEOUT, json={"model": model, "prompt": [ids, ids[:ctxlen + 1]],
                                          "echo": True, "logprobs": 1, "max_tokens": 1,
                                          "temperature": 0, "seed": 1234})
    assert r.status_code == 200, r.text
    first, second = r.json()["choices"]
    lp = first["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    continuation = lp["token_logprobs"][ctxlen:-1]
    assert continuation == pytest.approx(expected[ctxlen - 1:], abs=TOLERANCE)
    for token, top in zip(lp["tokens"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]):
        assert token in top and max(top.values()) <= 0  # the chosen token and the best
    assert len(second["logprobs"]["token_logprobs"]) == ctxlen + 2


def test_streamed_echo_with_logprobs_matches_the_answer(client, model, scored_prompt):
    ids, expected = scored_prompt
    kw = dict(model=model, prompt=PROMPT, echo=True, logprobs=2, max_tokens=4, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True)
              if c.choices]
    assert chunks[0].text == PROMPT
    assert len(chunks[0].logprobs.tokens) == len(ids)
    assert_scores(chunks[0].logprobs.token_logprobs, expected)
    assert "".join(c.text for c in chunks) == whole.text
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert streamed == whole.logprobs.token_logprobs
    offsets = [v for c in chunks if c.logprobs for v in c.logprobs.text_offset]
    assert offsets == whole.logprobs.text_offset


def test_streamed_max_tokens_0_sends_the_scored_prompt_then_the_end(client, model,
                                                                     scored_prompt):
    ids, expected = scored_prompt
    chunks = [c.choices[0] for c in client.completions.create(
        model=model, prompt=PROMPT, echo=True, logprobs=0, max_tokens=0, stream=True)
        if c.choices]
    echo, end = chunks
    assert echo.text == PROMPT and len(echo.logprobs.tokens) == len(ids)
    assert_scores(echo.logprobs.token_logprobs, expected)
    assert (end.text, end.logprobs, end.finish_reason) == ("", None, "length")


def test_echo_without_logprobs_is_unchanged(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, echo=True, max_tokens=2,
                                  temperature=0)
    assert r.choices[0].text.startswith(PROMPT) and r.choices[0].logprobs is None

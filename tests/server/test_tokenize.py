"""vLLM's POST /tokenize and POST /detokenize on a real server (bundled SmolLM2): the served
model's tokenizer, behind the OpenAI routes' auth, outside their admission."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.policy.helpers import Admin
from tests.support.openai_errors import openai_error
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess

TEXT = "Tokenizers split «naïve» text, emoji 🙂, double  spaces and code: def f(x): return x"
CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]

# Each route with a body it would answer.
ROUTES = [("/tokenize", {"prompt": TEXT}), ("/detokenize", {"tokens": [1, 2]})]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir: Path) -> Any:
    """transformers' own tokenizer of the bundled model, the yardstick."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _post(server: ServerProcess, path: str, body: Any,
          headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=TIMEOUT,
                      headers=server.headers if headers is None else headers)


def _tokenize(server: ServerProcess, **body: Any) -> dict[str, Any]:
    r = _post(server, "/tokenize", body)
    assert r.status_code == 200, r.text
    return r.json()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_prompt_tokens_equal_the_hf_tokenizers(server: ServerProcess, model: str,
                                               hf_tokenizer: Any) -> None:
    out = _tokenize(server, model=model, prompt=TEXT)
    assert out["tokens"] == hf_tokenizer.encode(TEXT, add_special_tokens=True)
    assert out["count"] == len(out["tokens"])


def test_max_model_len_is_the_model_cards(server: ServerProcess, client: openai.OpenAI) -> None:
    card = client.models.list().data[0]
    assert _tokenize(server, prompt="Hi")["max_model_len"] == card.max_model_len


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_count_equals_what_chat_completions_counts(server: ServerProcess,
                                                        client: openai.OpenAI, model: str,
                                                        add_generation_prompt: bool) -> None:
    out = _tokenize(server, model=model, messages=CONVERSATION,
                    add_generation_prompt=add_generation_prompt)
    r = client.chat.completions.create(
        model=model, messages=CONVERSATION, max_tokens=1, temperature=0,
        extra_body={"add_generation_prompt": add_generation_prompt})
    assert out["count"] == r.usage.prompt_tokens == len(out["tokens"])


def test_token_strs_are_the_vocabulary_strings_of_the_tokens(server: ServerProcess,
                                                             hf_tokenizer: Any) -> None:
    out = _tokenize(server, prompt=TEXT, return_token_strs=True)
    assert out["token_strs"] == hf_tokenizer.convert_ids_to_tokens(out["tokens"])


def test_token_strs_are_null_unless_asked(server: ServerProcess) -> None:
    out = _tokenize(server, messages=CONVERSATION)
    assert "token_strs" in out and out["token_strs"] is None


def test_detokenize_round_trips_tokenize(server: ServerProcess, model: str) -> None:
    tokens = _tokenize(server, model=model, prompt=TEXT)["tokens"]
    r = _post(server, "/detokenize", {"model": model, "tokens": tokens})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": TEXT}


@pytest.mark.parametrize("where", ["past the end", "negative"])
def test_detokenize_refuses_ids_outside_the_vocabulary(server: ServerProcess, hf_tokenizer: Any,
                                                       where: str) -> None:
    bad = len(hf_tokenizer) if where == "past the end" else -1
    err = openai_error(_post(server, "/detokenize", {"tokens": [1, bad, 2]}), 400)
    assert err["param"] == "tokens" and str(bad) in err["message"]


def test_tokenize_without_prompt_or_messages_is_400(server: ServerProcess, model: str) -> None:
    err = openai_error(_post(server, "/tokenize", {"model": model, "add_special_tokens": True}),
                       400)
    assert "`prompt`" in err["message"] and "`messages`" in err["message"]


@pytest.mark.parametrize("path,body", ROUTES, ids=["tokenize", "detokenize"])
def test_an_unserved_model_gets_the_chat_routes_error(server: ServerProcess, path: str,
                                                      body: dict[str, Any]) -> None:
    chat = openai_error(_post(server, "/v1/chat/completions",
                              {"model": "no-such-model", "messages": CONVERSATION}), 404)
    assert openai_error(_post(server, path, {**body, "model": "no-such-model"}), 404) == chat


@pytest.mark.parametrize("path,body", ROUTES, ids=["tokenize", "detokenize"])
def test_unauthenticated_is_401_as_on_the_openai_routes(server: ServerProcess, path: str,
                                                        body: dict[str, Any]) -> None:
    chat = openai_error(_post(server, "/v1/chat/completions", {"messages": CONVERSATION}, {}),
                        401)
    assert openai_error(_post(server, path, body, {}), 401) == chat
    # A bad key, once per route: each counts against the address's auth-failure limit, which
    # the whole session's server shares.
    bad = openai_error(_post(server, path, body, _bearer("sk-not-a-key")), 401)
    assert bad == chat and bad["code"] == "invalid_api_key"


def test_a_disabled_user_is_refused(server: ServerProcess) -> None:
    admin, name = Admin(server.base_url, Path(server.db_path)), f"gone-{uuid.uuid4().hex[:6]}"
    key = admin.user_with_key(name)
    assert _post(server, "/tokenize", {"prompt": "Hi"}, _bearer(key)).status_code == 200
    admin.request("PATCH", f"/users/{name}", json={"disabled": True})
    openai_error(_post(server, "/tokenize", {"prompt": "Hi"}, _bearer(key)), 401)


def test_tokenize_spends_no_quota_and_is_not_refused_by_it(server: ServerProcess) -> None:
    admin, name = Admin(server.base_url, Path(server.db_path)), f"thrifty-{uuid.uuid4().hex[:6]}"
    headers = _bearer(admin.user_with_key(name, max_tokens_per_day=1))
    chat = {"messages": CONVERSATION, "max_tokens": 1}
    for _ in range(3):  # were tokenizing charged, the chat below would be over the quota
        assert _post(server, "/tokenize", {"messages": CONVERSATION}, headers).status_code == 200
    assert _post(server, "/v1/chat/completions", chat, headers).status_code == 200
    openai_error(_post(server, "/v1/chat/completions", chat, headers), 429)  # now over it
    assert _post(server, "/tokenize", {"messages": CONVERSATION}, headers).status_code == 200


def test_tokenize_takes_no_concurrency_slot(server: ServerProcess) -> None:
    admin, name = Admin(server.base_url, Path(server.db_path)), f"single-{uuid.uuid4().hex[:6]}"
    headers = _bearer(admin.user_with_key(name, max_concurrent_requests=1))
    long_chat = {"messages": CONVERSATION, "max_tokens": 400, "stream": True,
                 "ignore_eos": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=long_chat,
                      headers=headers, timeout=TIMEOUT) as running:
        assert running.status_code == 200  # admitted: it holds the user's one slot
        lines = running.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        openai_error(_post(server, "/v1/chat/completions", {"messages": CONVERSATION},
                           headers), 429)
        assert _post(server, "/tokenize", {"messages": CONVERSATION}, headers).status_code == 200
        assert _post(server, "/detokenize", {"tokens": [1, 2]}, headers).status_code == 200

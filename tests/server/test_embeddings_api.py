"""POST /v1/embeddings on a real server (`--embedding-model all-MiniLM-L6-v2`, the bundled
encoder), asked through the `openai` client and plain HTTP: the vectors are
sentence-transformers' own, whatever the batch, the encoding or the input's form; the answer
counts its tokens, which count toward the daily quota; what the model cannot do is a 400
that says so."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from officellm.engine import BUNDLED_EMBEDDER, bundled_embedder_dir
from tests.support.server_api import TIMEOUT
from tests.support.server_process import API_KEY, ServerProcess
from tests.support.tiny_models import shared_tiny_model

TEXTS = ["The quarterly report is due on Friday.",
         "Le rapport trimestriel est attendu vendredi.",
         "Our cat sleeps on the printer every afternoon.",
         "x"]
MAX_INPUT_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
           ) -> Iterator[ServerProcess]:
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    # Ready (/health) once the chat model and the encoder have both loaded.
    with ServerProcess(str(model), "--embedding-model", BUNDLED_EMBEDDER) as s:
        yield s


def _listed(server: ServerProcess) -> list[str]:
    r = httpx.get(f"{server.base_url}/v1/models", timeout=TIMEOUT,
                  headers={"Authorization": f"Bearer {API_KEY}"})
    return [m["id"] for m in r.json()["data"]] if r.status_code == 200 else []


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_embedder_dir()), device="cpu")


def _post(server: ServerProcess, body: dict, key: str = API_KEY) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {key}"})


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_vectors_equal_sentence_transformers_own_encode(client, reference) -> None:
    got = client.embeddings.create(model=BUNDLED_EMBEDDER, input=TEXTS)
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    want = reference.encode(TEXTS)
    assert _cosines([d.embedding for d in got.data], want).min() >= 0.9999
    assert len(got.data[0].embedding) == 384


def test_a_batch_equals_its_inputs_one_by_one(client) -> None:
    batch = client.embeddings.create(model=BUNDLED_EMBEDDER, input=TEXTS)
    alone = [client.embeddings.create(model=BUNDLED_EMBEDDER, input=t).data[0].embedding
             for t in TEXTS]
    assert _cosines([d.embedding for d in batch.data], alone).min() >= 0.9999


def test_base64_carries_the_same_float32_vector(server) -> None:
    floats = _post(server, {"model": BUNDLED_EMBEDDER, "input": TEXTS[0]}).json()
    packed = _post(server, {"model": BUNDLED_EMBEDDER, "input": TEXTS[0],
                            "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats["data"][0]["embedding"],
                                                      dtype=np.float32))


def test_token_ids_give_the_vector_of_their_text(client, reference) -> None:
    ids = reference.tokenizer(TEXTS[2])["input_ids"]
    got = client.embeddings.create(model=BUNDLED_EMBEDDER, input=[ids])
    assert _cosines(got.data[0].embedding, reference.encode(TEXTS[2])) >= 0.9999
    assert got.usage.prompt_tokens == len(ids)


def test_usage_counts_every_inputs_tokens(client, reference) -> None:
    got = client.embeddings.create(model=BUNDLED_EMBEDDER, input=TEXTS)
    tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert (got.usage.prompt_tokens, got.usage.total_tokens) == (tokens, tokens)


def test_dimensions_the_model_was_not_trained_for_are_refused(server) -> None:
    r = _post(server, {"model": BUNDLED_EMBEDDER, "input": "hi", "dimensions": 128})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "dimensions"
    assert "not trained for 128" in r.json()["error"]["message"]
    full = _post(server, {"model": BUNDLED_EMBEDDER, "input": "hi", "dimensions": 384})
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 384


def test_an_input_longer_than_the_model_reads_is_refused_naming_it(server) -> None:
    long = "word " * 400
    r = _post(server, {"model": BUNDLED_EMBEDDER, "input": ["short", long]})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Input 1 is ")
    assert f"reads at most {MAX_INPUT_TOKENS}" in r.json()["error"]["message"]


def test_truncation_when_asked_cuts_as_sentence_transformers_does(server, reference) -> None:
    long = "word " * 400
    r = _post(server, {"model": BUNDLED_EMBEDDER, "input": long, "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == MAX_INPUT_TOKENS
    assert _cosines(r.json()["data"][0]["embedding"], reference.encode(long)) >= 0.9999


def test_a_token_id_the_model_does_not_know_is_refused(server) -> None:
    r = _post(server, {"model": BUNDLED_EMBEDDER, "input": [[101, 999_999, 102]]})
    assert r.status_code == 400
    assert "999999" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [{"input": ""}, {"input": []}, {"input": [[]]},
                                  {"input": "hi", "truncate_prompt_tokens": 0}])
def test_an_empty_input_is_a_400(server, body) -> None:
    r = _post(server, {"model": BUNDLED_EMBEDDER, **body})
    assert r.status_code == 400, r.text


def test_the_embedding_model_is_listed_and_refuses_chat(server, client) -> None:
    assert _listed(server)[-1] == BUNDLED_EMBEDDER
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model=BUNDLED_EMBEDDER, max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}])


def test_the_chat_model_refuses_embeddings_naming_the_embedding_model(server, client) -> None:
    chat_model = _listed(server)[0]
    with pytest.raises(openai.BadRequestError, match=BUNDLED_EMBEDDER):
        client.embeddings.create(model=chat_model, input="hi")


def test_embedding_tokens_count_toward_the_daily_quota(server) -> None:
    admin = {"Authorization": f"Bearer {server.admin_token}"}
    httpx.post(f"{server.base_url}/admin/users", json={"name": "emma"}, headers=admin,
               timeout=TIMEOUT).raise_for_status()
    httpx.put(f"{server.base_url}/admin/policies/users/emma",
              json={"max_tokens_per_day": 5}, headers=admin,
              timeout=TIMEOUT).raise_for_status()
    key = httpx.post(f"{server.base_url}/admin/keys", json={"user": "emma"}, headers=admin,
                     timeout=TIMEOUT).json()["key"]
    first = _post(server, {"model": BUNDLED_EMBEDDER, "input": TEXTS[0]}, key)
    assert first.status_code == 200 and first.json()["usage"]["prompt_tokens"] > 5
    over = _post(server, {"model": BUNDLED_EMBEDDER, "input": "hi"}, key)
    assert over.status_code == 429, over.text
    # The usage report counts it under the encoder, as embeddings besides the totals.
    (row,) = httpx.get(f"{server.base_url}/admin/usage", params={"by": "model", "user": "emma"},
                       headers=admin, timeout=TIMEOUT).json()["rows"]
    tokens = first.json()["usage"]["prompt_tokens"]
    assert (row["model"], row["requests"], row["prompt_tokens"], row["embedding_requests"],
            row["embedding_tokens"]) == (BUNDLED_EMBEDDER, 1, tokens, 1, tokens)


def test_the_admin_stats_count_the_embeddings_and_the_passes_they_took(server) -> None:
    admin = {"Authorization": f"Bearer {server.admin_token}"}
    before = httpx.get(f"{server.base_url}/admin/stats", headers=admin,
                       timeout=TIMEOUT).json()["embeddings"]
    assert _post(server, {"model": BUNDLED_EMBEDDER, "input": TEXTS}).status_code == 200
    after = httpx.get(f"{server.base_url}/admin/stats", headers=admin,
                      timeout=TIMEOUT).json()["embeddings"]
    assert (after["model"], after["state"]) == (BUNDLED_EMBEDDER, "ready")
    assert after["requests"] - before["requests"] == 1
    assert after["inputs"] - before["inputs"] == len(TEXTS)
    assert 1 <= after["batches"] - before["batches"] <= len(TEXTS)

"""Reranking on the app in-process: rerank models registered through the admin API (kind
rerank; a cross-encoder and a decoder reranker, told apart by their checkpoints) answer
Jina's and vLLM's /v1/rerank, Cohere's /v2/rerank and vLLM's /score in their shapes, with the
scores the models give; top_n and return_documents are honoured; what cannot be answered is
a 400 or 404 in OpenAI's error shape; a policy's models list applies; usage counts them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.engine import CrossEncoderScorer
from tests.support.tiny_rerankers import build_tiny_cross_encoder, build_tiny_decoder_reranker

RECORDED = Path(__file__).parent / "recorded"
QUERY = "Where do invoices go?"
DOCUMENTS = ["Invoices go to accounting on the third floor.",
             "The printer on floor 2 is out of toner.",
             "Lunch is at noon in the canteen.",
             "Expense reports and invoices are approved by the finance team."]


@dataclass
class Office:
    client: TestClient
    admin: dict[str, str]
    chat_model: str
    cross_encoder_dir: Path

    def key_for(self, name: str) -> dict[str, str]:
        assert self.client.post("/admin/users", json={"name": name},
                                headers=self.admin).status_code == 201
        key = self.client.post("/admin/keys", json={"user": name}, headers=self.admin).json()
        return {"Authorization": f"Bearer {key['key']}"}


@pytest.fixture(scope="module")
def office(reference_llm, tmp_path_factory: pytest.TempPathFactory,
           smollm2_dir: Path) -> Iterator[Office]:
    root = tmp_path_factory.mktemp("rerank-office")
    cross_encoder = build_tiny_cross_encoder(root / "cross-encoder")
    decoder = build_tiny_decoder_reranker(root / "qwen3-reranker", smollm2_dir)
    mp = pytest.MonkeyPatch()
    mp.setenv("OFFICELLM_DATA_DIR", str(root))  # the admin token's place
    app = create_app(ServerSettings(database=str(root / "officellm.db"), admin_remote=True),
                     lambda: reference_llm.llm_engine)
    token = next(root.rglob("admin_token")).read_text().strip()
    admin = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        assert app.state.server.default_model.async_engine.wait_ready(60)
        for name, source in (("ce", cross_encoder), ("qwen-rerank", decoder)):
            r = client.post("/admin/models", headers=admin, json={
                "name": name, "source": str(source), "kind": "rerank",
                "options": {"kv_cache_memory": "64MiB", "dtype": "float32"}})
            assert r.status_code == 201, r.text
        yield Office(client, admin, app.state.server.model_name, cross_encoder)
    mp.undo()


@pytest.fixture(scope="module")
def alice(office: Office) -> dict[str, str]:
    return office.key_for("alice")


@pytest.fixture(scope="module")
def cross_encoder_scores(office: Office) -> list[float]:
    """sentence-transformers' own scores of the pairs on the same checkpoint."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(office.cross_encoder_dir), device="cpu")
    return [float(s) for s in model.predict([[QUERY, d] for d in DOCUMENTS])]


def _post(office: Office, path: str, body: dict, headers: dict[str, str]) -> dict:
    r = office.client.post(path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_v1_rerank_ranks_the_documents_by_the_cross_encoders_scores(
        office, alice, cross_encoder_scores) -> None:
    got = _post(office, "/v1/rerank", {"model": "ce", "query": QUERY,
                                       "documents": DOCUMENTS}, alice)
    order = sorted(range(4), key=lambda i: -cross_encoder_scores[i])
    assert [r["index"] for r in got["results"]] == order
    assert [r["relevance_score"] for r in got["results"]] == pytest.approx(
        [cross_encoder_scores[i] for i in order], abs=1e-6)
    assert [r["document"]["text"] for r in got["results"]] == [DOCUMENTS[i] for i in order]
    assert got["model"] == "ce" and got["usage"]["total_tokens"] > 0


def test_top_n_and_return_documents_are_honoured(office, alice) -> None:
    body = {"model": "ce", "query": QUERY, "top_n": 2, "return_documents": False,
            "documents": [{"text": d} for d in DOCUMENTS]}  # Jina's document objects
    everything = _post(office, "/rerank", {**body, "top_n": None}, alice)["results"]
    top = _post(office, "/rerank", body, alice)["results"]
    assert [r["index"] for r in top] == [r["index"] for r in everything[:2]]
    assert all("document" not in r for r in top)


def test_cohere_v2_rerank_answers_in_cohere_shape(office, alice, cross_encoder_scores) -> None:
    got = _post(office, "/v2/rerank", {"model": "ce", "query": QUERY, "documents": DOCUMENTS,
                                       "top_n": 3}, alice)
    assert set(got) == {"id", "results", "meta"}
    assert len(got["results"]) == 3
    assert all(set(r) == {"index", "relevance_score"} for r in got["results"])
    best = max(range(4), key=lambda i: cross_encoder_scores[i])
    assert got["results"][0]["index"] == best
    assert got["meta"]["billed_units"] == {"search_units": 1}
    assert got["meta"]["api_version"]["version"] == "2"
    echoed = _post(office, "/v2/rerank", {"model": "ce", "query": QUERY,
                                          "documents": DOCUMENTS, "return_documents": True},
                   alice)
    assert echoed["results"][0]["document"]["text"] == DOCUMENTS[best]


def test_score_pairs_one_text_with_many_and_many_with_many(office, alice,
                                                           cross_encoder_scores) -> None:
    one_to_many = _post(office, "/score", {"model": "ce", "text_1": QUERY,
                                           "text_2": DOCUMENTS}, alice)
    assert [d["index"] for d in one_to_many["data"]] == [0, 1, 2, 3]
    assert all(d["object"] == "score" for d in one_to_many["data"])
    assert [d["score"] for d in one_to_many["data"]] == pytest.approx(cross_encoder_scores,
                                                                      abs=1e-6)
    queries = [QUERY, "Who fixes the printer?"]
    pairwise = _post(office, "/v1/score", {"model": "ce", "text_1": queries,
                                           "text_2": DOCUMENTS[:2]}, alice)
    scorer = CrossEncoderScorer(office.cross_encoder_dir, "cpu")
    want = [s.score for s in scorer.score(list(zip(queries, DOCUMENTS[:2])))]
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(want, abs=1e-6)
    assert pairwise["usage"]["prompt_tokens"] == pairwise["usage"]["total_tokens"] > 0


def test_a_decoder_reranker_is_served_on_the_engine(office, alice) -> None:
    got = _post(office, "/v1/rerank", {"model": "qwen-rerank", "query": QUERY,
                                       "documents": DOCUMENTS}, alice)
    scores = [r["relevance_score"] for r in got["results"]]
    assert all(0.0 < s < 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    served = office.client.app.state.server.models.find_reranker("qwen-rerank")
    assert served.reranker.info.scorer == "decoder"
    listed = {m["id"]: m for m in office.client.get("/v1/models", headers=alice).json()["data"]}
    assert listed["qwen-rerank"]["state"] == "ready"


@pytest.mark.parametrize("body, status, param", [
    ({"model": "ce", "query": QUERY, "documents": []}, 400, "documents"),
    ({"model": "nobody-has-this", "query": QUERY, "documents": DOCUMENTS}, 404, "model"),
])
def test_requests_that_cannot_be_answered_get_openai_errors(office, alice, body, status,
                                                            param) -> None:
    r = office.client.post("/v1/rerank", json=body, headers=alice)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    assert param in (r.json()["error"]["param"] or r.json()["error"]["message"])


def test_a_generate_model_named_for_rerank_is_a_400_naming_the_rerank_models(
        office, alice) -> None:
    r = office.client.post("/v2/rerank", json={"model": office.chat_model, "query": QUERY,
                                               "documents": DOCUMENTS}, headers=alice)
    assert r.status_code == 400, r.text
    assert "`ce`" in r.json()["error"]["message"]
    r = office.client.post("/score", json={"model": "ce", "text_1": [QUERY, QUERY, QUERY],
                                           "text_2": DOCUMENTS}, headers=alice)
    assert r.status_code == 400 and r.json()["error"]["param"] == "text_2"


def test_a_policy_without_the_rerank_model_refuses_it(office) -> None:
    bob = office.key_for("bob")
    r = office.client.put("/admin/policies/users/bob", headers=office.admin,
                          json={"models": [office.chat_model]})
    assert r.status_code == 200, r.text
    r = office.client.post("/v1/rerank", json={"model": "ce", "query": QUERY,
                                               "documents": DOCUMENTS}, headers=bob)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"


def test_usage_counts_rerank_requests_and_their_tokens(office) -> None:
    carol = office.key_for("carol")
    answers = [_post(office, "/v1/rerank", {"model": "ce", "query": QUERY,
                                            "documents": DOCUMENTS}, carol)["usage"],
               _post(office, "/score", {"model": "ce", "text_1": QUERY,
                                        "text_2": DOCUMENTS[:2]}, carol)["usage"]]
    r = office.client.get("/admin/usage", params={"by": "user"}, headers=office.admin)
    [row] = [row for row in r.json()["rows"] if row["user"] == "carol"]
    tokens = sum(u["total_tokens"] for u in answers)
    assert (row["rerank_requests"], row["rerank_tokens"]) == (2, tokens)
    assert (row["requests"], row["prompt_tokens"]) == (2, tokens)


def test_an_unloaded_rerank_model_is_shown_so_and_wakes_on_its_next_request(office,
                                                                             alice) -> None:
    _post(office, "/v1/rerank", {"model": "ce", "query": QUERY, "documents": DOCUMENTS}, alice)
    r = office.client.post("/admin/models/ce/unload", headers=office.admin)
    assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
    rows = {m["name"]: m for m in office.client.get("/admin/models",
                                                    headers=office.admin).json()["models"]}
    assert (rows["ce"]["kind"], rows["ce"]["state"]) == ("rerank", "unloaded")
    _post(office, "/v1/rerank", {"model": "ce", "query": QUERY, "documents": DOCUMENTS}, alice)
    rows = {m["name"]: m for m in office.client.get("/admin/models",
                                                    headers=office.admin).json()["models"]}
    assert rows["ce"]["state"] == "ready"


def test_open_webuis_recorded_rerank_request_gets_a_score_for_every_document(
        office, alice) -> None:
    """Open WebUI's external reranker (recorded, tests/server/recorded/): it pairs each
    result's relevance_score with its documents by index, so every document needs one."""
    record = json.loads((RECORDED / "open_webui_0.12.4_rerank.json").read_text())
    body = {**record["body"], "model": "ce"}  # the admin's name for its reranker
    r = office.client.post(record["path"], json=body, headers={**record["headers"], **alice})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == list(range(len(body["documents"])))
    scores = [x["relevance_score"] for x in results]
    assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)

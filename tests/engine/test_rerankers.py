"""Rerankers (engine/rerank): a cross-encoder gives sentence-transformers' CrossEncoder scores,
and a decoder reranker run on the engine gives Qwen3-Reranker's yes/no probability as
transformers computes it, batched or alone, its documents sharing the query's prefix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from officellm.engine import (
    AsyncReranker,
    CrossEncoderScorer,
    DecoderScorer,
    EngineConfig,
    load_scorer,
)
from tests.support.tiny_rerankers import build_tiny_cross_encoder, build_tiny_decoder_reranker

QUERY = "Where do invoices go?"
DOCUMENTS = ["Invoices go to accounting on the third floor.",
             "The printer on floor 2 is out of toner.",
             "Lunch is at noon in the canteen.",
             "Expense reports and invoices are approved by the finance team."]
# Qwen3-Reranker's model card, word for word.
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
               "on the Query and the Instruct provided. Note that the answer can only be "
               "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def _cpu_engine() -> EngineConfig:
    return EngineConfig(dtype="float32", quantization="none", kv_cache_dtype="float32",
                        kv_cache_memory="64MiB")


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("rerankers") / "cross-encoder")


@pytest.fixture(scope="module")
def decoder_reranker_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return build_tiny_decoder_reranker(tmp_path_factory.mktemp("qwen3-reranker"), smollm2_dir)


@pytest.fixture(scope="module")
def decoder_scorer(decoder_reranker_dir: Path) -> DecoderScorer:
    scorer = load_scorer(decoder_reranker_dir, engine_config=_cpu_engine())
    assert isinstance(scorer, DecoderScorer)
    yield scorer
    scorer.close()


def _rerank(scorer_factory, query: str, documents: list[str]):
    reranker = AsyncReranker(scorer_factory)
    reranker.start()
    try:
        assert reranker.wait_ready(120), reranker.unavailable_reason()
        return asyncio.run(reranker.score(query, documents)), reranker.stats()
    finally:
        reranker.stop()


def test_a_cross_encoder_scores_as_sentence_transformers_cross_encoder_predicts(
        cross_encoder_dir) -> None:
    from sentence_transformers import CrossEncoder

    assert isinstance(load_scorer(cross_encoder_dir, "cpu"), CrossEncoderScorer)
    scored, stats = _rerank(lambda: CrossEncoderScorer(cross_encoder_dir, "cpu"), QUERY,
                            DOCUMENTS)
    want = CrossEncoder(str(cross_encoder_dir), device="cpu").predict(
        [[QUERY, d] for d in DOCUMENTS])
    torch.testing.assert_close(torch.tensor([s.score for s in scored]),
                               torch.tensor(want).float(), atol=1e-6, rtol=1e-5)
    assert stats.batches == 1 and stats.pairs == 4
    assert all(s.tokens > len(QUERY.split()) for s in scored)  # query and document counted


def _card_scores(model_dir: Path, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """Qwen3-Reranker's model card's scoring code, in transformers (float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prefix = tokenizer.encode(CARD_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(CARD_SUFFIX, add_special_tokens=False)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    with torch.no_grad():
        for query, doc in pairs:
            text = f"<Instruct>: {CARD_INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}"
            ids = prefix + tokenizer.encode(text, add_special_tokens=False) + suffix
            logits = model(torch.tensor([ids])).logits[0, -1]
            pair = torch.stack([logits[no], logits[yes]]).log_softmax(-1)
            scores.append(pair[1].exp())
    return torch.stack(scores)


def test_a_decoder_reranker_gives_the_model_cards_yes_probability(
        decoder_reranker_dir, decoder_scorer) -> None:
    scored = decoder_scorer.score([(QUERY, d) for d in DOCUMENTS])
    want = _card_scores(decoder_reranker_dir, [(QUERY, d) for d in DOCUMENTS])
    torch.testing.assert_close(torch.tensor([s.score for s in scored]), want.float(),
                               atol=1e-5, rtol=1e-4)
    assert [s.tokens for s in scored] == [len(decoder_scorer.prompt_ids(QUERY, d))
                                          for d in DOCUMENTS]


def test_a_decoder_rerankers_batched_scores_equal_each_alone(decoder_scorer) -> None:
    together = [s.score for s in decoder_scorer.score([(QUERY, d) for d in DOCUMENTS])]
    alone = [decoder_scorer.score([(QUERY, d)])[0].score for d in DOCUMENTS]
    torch.testing.assert_close(torch.tensor(together), torch.tensor(alone),
                               atol=1e-6, rtol=1e-5)


def test_a_querys_documents_share_its_prompt_opening_through_the_prefix_cache(
        decoder_scorer) -> None:
    before = decoder_scorer.engine.stats().prefix_cache_hits
    decoder_scorer.score([("A query never seen before?", d) for d in DOCUMENTS])
    # The system prompt, instruction and query are one block or more: each document after
    # the first finds them cached.
    assert decoder_scorer.engine.stats().prefix_cache_hits > before

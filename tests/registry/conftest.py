"""Fixtures: a fake Hub on 127.0.0.1 serving a tiny model, and huggingface_hub pointed at it
(never at huggingface.co, never at the user's cache)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from tests.support.fake_hub import FakeHub

REPO = "office/tiny-model"


def tiny_model_files() -> dict[str, bytes]:
    """A model repo as the Hub holds it: what officellm needs, and what it must leave."""
    weights = save({"embed.weight": np.arange(64 * 256, dtype=np.float32).reshape(64, 256)})
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 256}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "model.safetensors": weights,
        "pytorch_model.bin": b"\x80" * 4096,  # the same weights, pickled: never fetched
        "onnx/model.onnx": b"\x08" * 4096,
        "onnx/config.json": b"{}",  # a json, but in another runtime's folder
        "README.md": b"# tiny\n",
    }


@pytest.fixture(autouse=True)
def _offline_from_huggingface_co(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # The tests' own cache and data directory; and online, whatever the machine says, since
    # the Hub they talk to is the fake one on 127.0.0.1.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("OFFICELLM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The fake Hub serving REPO, as HF_ENDPOINT (and huggingface_hub's constant read from it
    at import)."""
    from huggingface_hub import constants

    fake = FakeHub(REPO, tiny_model_files())
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    yield fake
    fake.close()

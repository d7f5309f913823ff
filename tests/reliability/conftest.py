"""Fixtures of the reliability tests: tiny random-weight models (fast on two CPU cores), so the
hardening tests exercise the server, not the model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.tiny_models import shared_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A 3-layer random-weight Llama with SmolLM2's tokenizer and chat template."""
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)

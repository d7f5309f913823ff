"""Engine fixtures: prompts, transformers references computed once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from officellm.engine import LLM
from officellm.engine.llm import apply_chat_template
from officellm.engine.loading.model_loader import eos_token_ids
from tests.support.hf_reference import HFGreedy, hf_greedy, load_hf_model

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about a cat sleeping in the sun."}],
    [{"role": "system", "content": "You are a terse assistant. Answer in one line."},
     {"role": "user", "content": "How many legs does a spider have?"}],
    [{"role": "user", "content": "List three uses of a paperclip."}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish and German."}],
    [{"role": "user", "content": "Explain what a KV cache is in a large language model, "
                                 "in two sentences, for an office manager."}],
    [{"role": "user", "content": "def fib(n):\n    # complete this Python function"}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me a fun fact about octopuses."}],
]
MAX_NEW = 32  # long enough for near-ties and EOS to show, short enough for CI
POISON = 777  # a token whose embedding is NaN in the poisoned model


@pytest.fixture(scope="session")
def chat_prompt_ids(smollm2_tokenizer) -> list[list[int]]:
    return [apply_chat_template(smollm2_tokenizer, c) for c in CHATS]


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_checkpoint: Path):
    return load_hf_model(smollm2_checkpoint)


@pytest.fixture(scope="session")
def smollm2_refs(request, tmp_path_factory, smollm2_dir, smollm2_tokenizer,
                 chat_prompt_ids) -> list[HFGreedy]:
    """transformers' greedy replies to CHATS, computed once per run: pytest-xdist's workers
    share them through a file in the run's temporary directory (each worker spent ~25 s of
    float32 generation on the same chats)."""

    def compute() -> list[HFGreedy]:
        hf = request.getfixturevalue("smollm2_hf")
        eos = eos_token_ids(smollm2_dir, smollm2_tokenizer)
        return [hf_greedy(hf, ids, MAX_NEW, eos) for ids in chat_prompt_ids]

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return compute()  # the parent of a lone run's basetemp outlives the run: no file
    shared = tmp_path_factory.getbasetemp().parent / "smollm2_refs.pt"
    with FileLock(f"{shared}.lock"):
        if shared.is_file():
            saved = torch.load(shared)
            return [HFGreedy(ids, list(lps)) for ids, lps in saved]
        refs = compute()
        torch.save([(r.token_ids, torch.stack(r.logprobs)) for r in refs], shared)
        return refs


def make_llm(model_dir: Path, **kwargs) -> LLM:
    """An fp32 engine on the CPU, weights dense and KV cache float32 (transformers'
    numbers), with a modest KV pool unless a test says otherwise (a test choosing another
    dtype gets that dtype's cache)."""
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("quantization", "none")
    if kwargs["dtype"] == "float32":
        kwargs.setdefault("kv_cache_dtype", "float32")
    kwargs.setdefault("kv_cache_memory", "128MiB")
    return LLM(str(model_dir), **kwargs)


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_dir: Path) -> LLM:
    """The default-configured fp32 engine shared by tests that do not change its settings."""
    return make_llm(smollm2_dir)


@pytest.fixture(scope="session")
def poisoned_model(tmp_path_factory, smollm2_dir: Path) -> Path:
    """A tiny Llama (untied head) whose embedding of POISON is NaN."""
    from tests.support.tiny_models import build_tiny_model, poison_token

    model_dir = build_tiny_model("llama", tmp_path_factory.mktemp("poisoned"), smollm2_dir)
    return poison_token(model_dir, POISON)

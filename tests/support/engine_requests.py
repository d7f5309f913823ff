"""Requests the engine tests send: random prompts of token ids, and one request run alone."""

from __future__ import annotations

import itertools

import torch

from officellm.engine import CompletionOutput, OutputKind, SamplingParams

_ids = itertools.count()


def random_prompt(seed: int, length: int) -> list[int]:
    """`length` token ids drawn from the middle of a vocabulary, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (length,), generator=g).tolist()


def greedy_alone(llm, prompt: list[int], salt: str | None = None,
                 max_tokens: int = 8) -> CompletionOutput:
    """The request's output (token ids and each token's logprob), greedy, run alone
    through the LLM's engine under the prefix-cache salt `salt`."""
    engine = llm.llm_engine
    engine.add_request(f"alone-{next(_ids)}", prompt,
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1),
                       cache_salt=salt, output_kind=OutputKind.FINAL)
    done = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done = out
    assert done is not None
    return done.outputs[0]

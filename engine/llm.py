"""The offline API in vLLM's shape: LLM(model).generate(prompts, params)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from officellm.engine.config import EngineConfig
from officellm.engine.frontend.output_processor import OutputKind
from officellm.engine.frontend.outputs import RequestOutput
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.multimodal.inputs import MultiModalPrompt

# Text, token ids, or token ids with images (LLMEngine.multimodal_processor makes those).
Prompt = str | list[int] | MultiModalPrompt
Message = dict[str, Any]


class LLM:
    """Generate for a batch of prompts with continuous batching under the hood.

    Keyword arguments are EngineConfig's fields (vLLM's names).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's tensor-parallel worker processes, if any (idempotent)."""
        self.llm_engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 multimodal: MultiModalPrompt | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.

        A prompt is a string, a list of token ids, or a MultiModalPrompt (token ids with
        images); `multimodal=` is one such prompt given alone (prompts None).
        """
        if multimodal is not None:
            if prompts is not None:
                raise ValueError("Give the prompts, or one multimodal prompt, not both.")
            prompts = [multimodal]
        if prompts is None:
            raise ValueError("Give at least one prompt.")
        if isinstance(prompts, (str, MultiModalPrompt)) or (
                prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (list(sampling_params) if isinstance(sampling_params, Sequence)
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError("Give one SamplingParams, or one per prompt.")
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params):
            if isinstance(prompt, MultiModalPrompt):
                self.llm_engine.add_request(rid, None, p, output_kind=OutputKind.FINAL,
                                            multimodal=prompt)
            else:
                self.llm_engine.add_request(rid, prompt, p, output_kind=OutputKind.FINAL)
        return self._run(ids)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(c, add_generation_prompt, **(chat_template_kwargs or {}))
                   for c in convs]  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params)

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True,
                            **kwargs: Any) -> list[int]:
        return apply_chat_template(self.llm_engine.tokenizer, messages, add_generation_prompt, **kwargs)

    def _run(self, ids: list[str]) -> list[RequestOutput]:
        engine = self.llm_engine
        results: dict[str, RequestOutput] = {}
        pending = set(ids)
        while pending:
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"engine idle with requests pending: {sorted(pending)}")
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    results[out.request_id] = out
                    pending.discard(out.request_id)
        return [results[i] for i in ids]


def apply_chat_template(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True,
                        **kwargs: Any) -> list[int]:
    """Token ids of a conversation under the tokenizer's chat template (transformers' semantics)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True, **kwargs)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return list(out)

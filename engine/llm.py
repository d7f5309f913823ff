"""The offline API in vLLM's shape: LLM(model).generate(prompts, params)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    """Generate for a batch of prompts with continuous batching under the hood."""

    def __init__(self, model: str | None = None, *, device: str = "cpu", dtype: str = "auto",
                 max_model_len: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 enable_prefix_caching: bool = True, kv_cache_memory: int | str | None = None,
                 gpu_memory_utilization: float = 0.9, seed: int = 0,
                 tensor_parallel_size: int = 1, **kwargs: Any) -> None:
        config = EngineConfig(
            model=model, device=device, dtype=dtype, max_model_len=max_model_len,
            block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, kv_cache_memory=kv_cache_memory,
            gpu_memory_utilization=gpu_memory_utilization, seed=seed,
            tensor_parallel_size=tensor_parallel_size, **kwargs)
        self.llm_engine = LLMEngine(config)
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

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 **_: Any) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.

        A prompt is a string or a list of token ids.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
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
            self.llm_engine.add_request(rid, prompt, p)
        return self._run(ids)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True,
             chat_template_kwargs: dict[str, Any] | None = None, **_: Any) -> list[RequestOutput]:
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
            for delta in engine.step():
                if delta.request_id not in pending:
                    continue
                acc = results.get(delta.request_id)
                if acc is None:
                    acc = results[delta.request_id] = RequestOutput(
                        delta.request_id, delta.prompt, delta.prompt_token_ids, [], False,
                        delta.num_cached_tokens, delta.metrics)
                _merge(acc, delta)
                acc.error = acc.error or delta.error
                if delta.finished:
                    acc.finished = True
                    acc.outputs.sort(key=lambda o: o.index)
                    pending.discard(delta.request_id)
        return [results[i] for i in ids]


def _merge(acc: RequestOutput, delta: RequestOutput) -> None:
    by_index = {o.index: o for o in acc.outputs}
    for d in delta.outputs:
        o = by_index.get(d.index)
        if o is None:
            o = CompletionOutput(d.index, "", [], logprobs=[] if d.logprobs is not None else None)
            acc.outputs.append(o)
            by_index[d.index] = o
        o.text += d.text
        o.token_ids.extend(d.token_ids)
        if d.logprobs is not None and o.logprobs is not None:
            o.logprobs.extend(d.logprobs)
        o.finish_reason = d.finish_reason
        o.stop_reason = d.stop_reason
        o.num_output_tokens = d.num_output_tokens


def apply_chat_template(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True,
                        **kwargs: Any) -> list[int]:
    """Token ids of a conversation under the tokenizer's chat template (transformers' semantics)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True, **kwargs)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return list(out)

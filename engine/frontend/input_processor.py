"""The front end's way in: a prompt to token ids, the model's length rule, n-way fan-out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.frontend.sampling_params import SamplingParams

if TYPE_CHECKING:
    import xgrammar as xgr

    from officellm.engine.multimodal.inputs import MultiModalPrompt


class PromptTooLongError(ValueError):
    """The prompt (plus at least one generated token) exceeds max_model_len."""


class InputProcessor:
    """Turns a request into the EngineCoreRequests the core runs.

    The length rule and its sentences (vLLM's wording, which clients already parse) live
    here and nowhere else; the server's own limits add theirs in app/models/prompt.py.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a text prompt (with the tokenizer's special tokens), or the ids given."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return [int(t) for t in prompt]

    def check_prompt(self, token_ids: list[int], max_tokens: int | None = None) -> None:
        """Raise ValueError for ids the model cannot read, PromptTooLongError when the
        request cannot fit in max_model_len (with `max_tokens`, prompt plus completion)."""
        if not token_ids:
            raise ValueError("The prompt is empty.")
        if max(token_ids) >= self.vocab_size or min(token_ids) < 0:
            raise ValueError(f"Prompt token ids must be in [0, {self.vocab_size}).")
        n, mml = len(token_ids), self.max_model_len
        if n + 1 > mml:
            raise PromptTooLongError(
                f"This model's maximum context length is {mml} tokens. However, your request has "
                f"{n} input tokens. Please reduce the length of the input messages.")
        if max_tokens is not None and n + max_tokens > mml:
            raise PromptTooLongError(
                f"This model's maximum context length is {mml} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.")

    @staticmethod
    def core_requests(request_id: str, token_ids: list[int], params: SamplingParams,
                      cache_salt: str | None = None, *, fairness_key: str | None = None,
                      priority: float = 1.0, max_kv_share: float | None = None,
                      background: bool = False, grammar: xgr.CompiledGrammar | None = None,
                      multimodal: MultiModalPrompt | None = None) -> list[EngineCoreRequest]:
        """The n sequences of a request: the request's id when n is 1, else `id#i`, each
        seeded with the request's seed plus its index. All carry the same opaque tags (the
        prefix-cache salt; the scheduling policy's key, weight and KV share cap; whether it
        is background work) and the
        same compiled grammar (each sequence matches it on its own), and the same images
        (`multimodal`, whose token_ids are `token_ids`)."""
        if (grammar is None) != (params.structured_outputs is None):
            raise ValueError("A request with structured_outputs needs its compiled grammar "
                             "(GrammarCompiler.compile), and only such a request has one.")
        tags = {"cache_salt": cache_salt, "fairness_key": fairness_key, "priority": priority,
                "max_kv_share": max_kv_share, "background": background, "grammar": grammar,
                "multimodal": multimodal}
        if params.n == 1:
            return [EngineCoreRequest(request_id, token_ids, params, params.seed, **tags)]
        return [EngineCoreRequest(f"{request_id}#{i}", token_ids, params,
                                  None if params.seed is None else params.seed + i, **tags)
                for i in range(params.n)]

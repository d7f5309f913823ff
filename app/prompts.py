"""Turning what a client sent into prompt token ids (run on the engine's thread)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.llm import apply_chat_template


class ContextLimitError(ValueError):
    """The prompt is longer than the server's context cap (DESIGN §6's wording)."""


@dataclass
class ChatPrompt:
    """A conversation to render with the model's chat template (transformers' semantics)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptBuilder:
    """Callable the engine thread runs to get token ids; the tokenizer is only used there,
    since the engine (tokenizer included) belongs to that one thread."""

    prompt: str | list[int] | ChatPrompt
    max_context_tokens: int | None = None

    def __call__(self, engine: Any) -> list[int]:
        if isinstance(self.prompt, ChatPrompt):
            try:
                ids = apply_chat_template(engine.tokenizer, self.prompt.messages,
                                          self.prompt.add_generation_prompt,
                                          **self.prompt.template_kwargs)
            except Exception as exc:  # jinja errors (e.g. roles out of order) are the client's
                raise ValueError(f"The chat template could not render these messages: {exc}") from exc
        else:
            ids = engine.encode_prompt(self.prompt)
        # The model's own limit first, in vLLM's wording, then the server's policy cap.
        engine.check_prompt_length(len(ids), None)
        cap = self.max_context_tokens
        if cap is not None and len(ids) > cap:
            raise ContextLimitError(
                f"This chat has reached {len(ids):,} tokens, over your limit of {cap:,}. "
                "Please start a new chat.")
        return ids

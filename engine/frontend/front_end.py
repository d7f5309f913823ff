"""The engine's front end for one loaded core: the tokenizer and what is built on it (prompt
checks, detokenization, grammar compilation), made from what the core reports of itself.

It lives wherever requests come in: beside the core in LLMEngine, and in the server's process
when the core runs in a process of its own (engine/core_client/), which sends an EngineInfo
once it has loaded; the front end then loads only the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from officellm.engine.frontend.input_processor import InputProcessor
from officellm.engine.frontend.output_processor import OutputProcessor
from officellm.engine.loading.tokenizer import load_tokenizer
from officellm.engine.multimodal.processor import MultiModalProcessor, load_multimodal_processor
from officellm.engine.structured_output.compiler import GrammarCompiler


@dataclass(frozen=True)
class EngineInfo:
    """What a loaded core says of its model: where it is, what it is called, its length
    rule, its default answer length (generation_config's max_new_tokens, or None), the
    width of its logits, the ids that end a sequence, and whether it takes images (a vision
    tower the engine runs and a processor for its prompts: engine/multimodal/)."""

    model_dir: str
    model_name: str
    max_model_len: int
    max_new_tokens: int | None
    vocab_size: int
    eos_token_ids: list[int]
    vision: bool = False


class EngineFrontEnd:
    """The tokenizer of a loaded model and the front end's parts built on it."""

    def __init__(self, info: EngineInfo, tokenizer: Any | None = None) -> None:
        self.info = info
        self.model_dir = Path(info.model_dir)
        self.model_name = info.model_name
        self.max_model_len = info.max_model_len
        self.max_new_tokens = info.max_new_tokens
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_dir)
        self.input_processor = InputProcessor(self.tokenizer, info.vocab_size, info.max_model_len)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.grammar_compiler = GrammarCompiler(self.tokenizer, info.vocab_size,
                                                sorted(info.eos_token_ids))
        # Token ids with image markers and PIL images -> a MultiModalPrompt (None: the model
        # takes no images).
        self.multimodal_processor: MultiModalProcessor | None = (
            load_multimodal_processor(self.model_dir, self.tokenizer) if info.vision else None)

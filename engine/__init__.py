"""officellm's paged inference engine (no HTTP, users or SQL in here)."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine, PromptTooLongError
from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats

__all__ = [
    "LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput",
    "Logprob", "EngineStats", "PromptTooLongError",
]

"""officellm's paged inference engine (no HTTP, users or SQL in here)."""

from engine.cpu_caches import bound_cpu_kernel_caches

bound_cpu_kernel_caches()  # before anything below imports torch

from engine.config import EngineConfig  # noqa: E402
from engine.input_processor import PromptTooLongError  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.output_processor import OutputKind  # noqa: E402
from engine.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.stats import EngineStats  # noqa: E402

__all__ = [
    "LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput",
    "Logprob", "EngineStats", "PromptTooLongError", "OutputKind",
]

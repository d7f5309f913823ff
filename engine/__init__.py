"""officellm's paged inference engine (no HTTP, users or SQL in here).

This module is the engine's public API: app/ imports from `officellm.engine` alone, never a
submodule (tests/architecture/test_engine_front_door.py), so everything below may move
without the server noticing. Importing it has no side effect; the engine bounds oneDNN's CPU
caches when it starts (engine/cpu_caches.py).
"""

from officellm.engine.async_llm import AsyncLLM, RequestAborted
from officellm.engine.config import (
    KV_DISK_AUTO,
    EngineConfig,
    engine_knobs,
    parse_memory,
    parse_offloading_size,
)
from officellm.engine.core.logprob import Logprob
from officellm.engine.embedding.async_embedder import AsyncEmbedder, EmbedderStats
from officellm.engine.embedding.bundled import BUNDLED_EMBEDDER, bundled_embedder_dir
from officellm.engine.embedding.decoder_encoder import DecoderEncoder
from officellm.engine.embedding.encoders import Encoder, load_encoder
from officellm.engine.embedding.process_encoder import ProcessEncoder
from officellm.engine.embedding.sentence_encoder import EncoderInfo, SentenceEncoder
from officellm.engine.frontend.front_end import EngineFrontEnd, EngineInfo
from officellm.engine.frontend.input_processor import InputProcessor, PromptTooLongError
from officellm.engine.frontend.output_processor import IterationStats, OutputKind
from officellm.engine.frontend.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from officellm.engine.frontend.sampling_params import BOUNDS, SamplingParams, SamplingParamsError
from officellm.engine.kv_offload.disk_tier import kv_disk_owner, purge_kv_disk
from officellm.engine.kv_plan import (
    KVCacheTooSmallError,
    KVPlan,
    dtype_bytes,
    format_plan,
    gguf_weight_bytes,
    load_spec,
    make_plan,
)
from officellm.engine.llm import LLM, apply_chat_template
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.loading.model_spec import UnsupportedModelError, check_architecture
from officellm.engine.loading.tokenizer import load_tokenizer
from officellm.engine.memory_footprint import (
    ModelFootprint,
    default_memory_budget,
    estimate_footprint,
    tier_ram_bytes,
)
from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)
from officellm.engine.precision.kv_cache_dtype import check_kv_cache_dtype
from officellm.engine.stats import DiskTierStats, EngineStats, HostTierStats
from officellm.engine.structured_output import StructuredOutputError, StructuredOutputsParams
from officellm.engine.structured_output.json_schema_support import check_json_schema
from officellm.engine.worker.multiproc_executor import WorkerDiedError

__all__ = [
    # Running a model: offline, step by step, and from asyncio (the server)
    "LLM", "LLMEngine", "AsyncLLM", "EngineFrontEnd", "EngineInfo",
    # Embedding models: a sentence-transformers encoder on its own thread, batched
    "AsyncEmbedder", "load_encoder", "Encoder", "SentenceEncoder", "DecoderEncoder",
    "ProcessEncoder",
    "EncoderInfo", "EmbedderStats",
    "BUNDLED_EMBEDDER", "bundled_embedder_dir",
    "EngineState", "LoadFailure", "EngineDeadError", "RequestAborted",
    # Configuration and the KV-cache plan (`officellm plan`, the CLI's knobs)
    "EngineConfig", "engine_knobs", "parse_memory", "parse_offloading_size", "KV_DISK_AUTO",
    "load_spec", "gguf_weight_bytes", "make_plan", "format_plan", "KVPlan", "KVCacheTooSmallError", "dtype_bytes",
    "check_kv_cache_dtype", "check_architecture", "UnsupportedModelError",
    # Several models in one memory budget (the server's model pool)
    "ModelFootprint", "estimate_footprint", "default_memory_budget",
    # Requests in: sampling, structured outputs, prompts
    "SamplingParams", "SamplingParamsError", "BOUNDS",
    "StructuredOutputsParams", "StructuredOutputError", "check_json_schema",
    "InputProcessor", "PromptTooLongError", "apply_chat_template", "load_tokenizer",
    # Results out
    "RequestOutput", "CompletionOutput", "Logprob", "PromptLogprobs", "OutputKind",
    # The KV cache's disk tier: a person's blocks purged, running or not
    "purge_kv_disk", "kv_disk_owner",
    # Observability
    "EngineStats", "IterationStats", "ModelLifecycle", "DiskTierStats", "HostTierStats", "tier_ram_bytes",
    # Failures
    "WorkerDiedError",
]

"""officellm's paged inference engine (no HTTP, users or SQL in here).

This module is the engine's public API: app/ imports from `officellm.engine` alone, never a
submodule (tests/architecture/test_engine_front_door.py), so everything below may move
without the server noticing. Importing it has no side effect and loads nothing: each name
is imported from its module when first used (PEP 562), so a process that needs the
configuration or the core's messages does not pay for torch (an engine process imports
torch on its load thread, behind the models serving: engine/core_client/engine_process.py).
The engine bounds oneDNN's CPU caches when it starts (engine/cpu_caches.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives, by what it is for.
_WHERE: dict[str, str] = {
    # Running a model: offline, step by step, and from asyncio (the server)
    "LLM": "officellm.engine.llm",
    "LLMEngine": "officellm.engine.llm_engine",
    "AsyncLLM": "officellm.engine.async_llm",
    "EngineFrontEnd": "officellm.engine.frontend.front_end",
    "EngineInfo": "officellm.engine.frontend.front_end",
    # Embedding models: a sentence-transformers encoder on its own thread, batched
    "AsyncEmbedder": "officellm.engine.embedding.async_embedder",
    "load_encoder": "officellm.engine.embedding.encoders",
    "Encoder": "officellm.engine.embedding.encoders",
    "SentenceEncoder": "officellm.engine.embedding.sentence_encoder",
    "DecoderEncoder": "officellm.engine.embedding.decoder_encoder",
    "ProcessEncoder": "officellm.engine.embedding.process_encoder",
    "EncoderInfo": "officellm.engine.embedding.sentence_encoder",
    "EmbedderStats": "officellm.engine.embedding.async_embedder",
    "BUNDLED_EMBEDDER": "officellm.engine.embedding.bundled",
    "bundled_embedder_dir": "officellm.engine.embedding.bundled",
    # Speech to text: audio decoded by PyAV, a Whisper model on its own thread, windows batched
    "AsyncTranscriber": "officellm.engine.speech.async_transcriber",
    "TranscriberStats": "officellm.engine.speech.async_transcriber",
    "WhisperTranscriber": "officellm.engine.speech.whisper_transcriber",
    "TranscriptionOptions": "officellm.engine.speech.whisper_transcriber",
    "TranscriberInfo": "officellm.engine.speech.whisper_transcriber",
    "WindowTranscript": "officellm.engine.speech.whisper_transcriber",
    "Segment": "officellm.engine.speech.whisper_transcriber",
    "WINDOW_SECONDS": "officellm.engine.speech.whisper_transcriber",
    "decode_audio": "officellm.engine.speech.audio_decoding",
    "AudioDecodeError": "officellm.engine.speech.audio_decoding",
    "SAMPLE_RATE": "officellm.engine.speech.audio_decoding",
    # Rerank models: a cross-encoder (sentence-transformers) or a decoder reranker (the
    # engine's yes/no logit) on its own thread, batched
    "AsyncReranker": "officellm.engine.rerank.async_reranker",
    "RerankerStats": "officellm.engine.rerank.async_reranker",
    "Scorer": "officellm.engine.rerank.scorer",
    "ScoredPair": "officellm.engine.rerank.scorer",
    "RerankerInfo": "officellm.engine.rerank.scorer",
    "load_scorer": "officellm.engine.rerank.scorer",
    "CrossEncoderScorer": "officellm.engine.rerank.cross_encoder_scorer",
    "DecoderScorer": "officellm.engine.rerank.decoder_scorer",
    "EngineState": "officellm.engine.model_lifecycle",
    "LoadFailure": "officellm.engine.model_lifecycle",
    "EngineDeadError": "officellm.engine.model_lifecycle",
    "RequestAborted": "officellm.engine.async_llm",
    # Configuration and the KV-cache plan (`officellm plan`, the CLI's knobs)
    "EngineConfig": "officellm.engine.config",
    "engine_knobs": "officellm.engine.config",
    "parse_memory": "officellm.engine.config",
    "parse_offloading_size": "officellm.engine.config",
    "KV_DISK_AUTO": "officellm.engine.config",
    "load_spec": "officellm.engine.kv_plan",
    "gguf_weight_bytes": "officellm.engine.kv_plan",
    "make_plan": "officellm.engine.kv_plan",
    "format_plan": "officellm.engine.kv_plan",
    "KVPlan": "officellm.engine.kv_plan",
    "KVCacheTooSmallError": "officellm.engine.kv_plan",
    "dtype_bytes": "officellm.engine.kv_plan",
    "check_kv_cache_dtype": "officellm.engine.precision.kv_cache_dtype",
    "check_architecture": "officellm.engine.loading.model_spec",
    "UnsupportedModelError": "officellm.engine.loading.model_spec",
    "default_model_name": "officellm.engine.loading.model_loader",
    # Several models in one memory budget (the server's model pool)
    "ModelFootprint": "officellm.engine.memory_footprint",
    "estimate_footprint": "officellm.engine.memory_footprint",
    "default_memory_budget": "officellm.engine.memory_footprint",
    # Requests in: sampling, structured outputs, prompts
    "SamplingParams": "officellm.engine.frontend.sampling_params",
    "SamplingParamsError": "officellm.engine.frontend.sampling_params",
    "BOUNDS": "officellm.engine.frontend.sampling_params",
    "StructuredOutputsParams": "officellm.engine.structured_output",
    "StructuredOutputError": "officellm.engine.structured_output",
    "check_json_schema": "officellm.engine.structured_output.json_schema_support",
    "InputProcessor": "officellm.engine.frontend.input_processor",
    "PromptTooLongError": "officellm.engine.frontend.input_processor",
    "apply_chat_template": "officellm.engine.llm",
    "load_tokenizer": "officellm.engine.loading.tokenizer",
    # Images in prompts (vision models): the processor makes a MultiModalPrompt
    "ImageFeature": "officellm.engine.multimodal.inputs",
    "MultiModalPrompt": "officellm.engine.multimodal.inputs",
    "ImageInputError": "officellm.engine.multimodal.inputs",
    "MultiModalProcessor": "officellm.engine.multimodal.processor",
    "load_multimodal_processor": "officellm.engine.multimodal.processor",
    # Results out
    "RequestOutput": "officellm.engine.frontend.outputs",
    "CompletionOutput": "officellm.engine.frontend.outputs",
    "Logprob": "officellm.engine.core.logprob",
    "PromptLogprobs": "officellm.engine.frontend.outputs",
    "OutputKind": "officellm.engine.frontend.output_processor",
    # The KV cache's disk tier: a person's blocks purged, running or not
    "purge_kv_disk": "officellm.engine.kv_offload.disk_tier",
    "kv_disk_owner": "officellm.engine.kv_offload.disk_tier",
    # Observability
    "EngineStats": "officellm.engine.stats",
    "IterationStats": "officellm.engine.frontend.output_processor",
    "ModelLifecycle": "officellm.engine.model_lifecycle",
    "BatchingThread": "officellm.engine.batching_thread",
    "DiskTierStats": "officellm.engine.stats",
    "HostTierStats": "officellm.engine.stats",
    "tier_ram_bytes": "officellm.engine.memory_footprint",
    # Failures
    "WorkerDiedError": "officellm.engine.worker.multiproc_executor",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])

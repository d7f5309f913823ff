"""LLMEngine: the engine core with its front end (prompts in, text out), in one thread."""

from __future__ import annotations

from typing import Any

from officellm.engine.config import EngineConfig
from officellm.engine.engine_core import EngineCore
from officellm.engine.frontend.front_end import EngineFrontEnd, EngineInfo
from officellm.engine.frontend.output_processor import OutputKind
from officellm.engine.frontend.outputs import RequestOutput
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.loading.model_loader import (
    default_model_name,
    eos_token_ids,
    generation_max_new_tokens,
    resolve_model_dir,
)
from officellm.engine.loading.tokenizer import load_tokenizer
from officellm.engine.multimodal.inputs import ImageInputError, MultiModalPrompt
from officellm.engine.stats import EngineStats


class LLMEngine:
    """The paged inference engine, vLLM v1's way: the EngineCore (schedule -> execute ->
    update, token ids only) and its front end (engine/frontend/front_end.py: an InputProcessor, prompt
    -> core requests, and an OutputProcessor, tokens -> text, stop strings, n-way fan-in,
    deltas).

    Knows nothing of HTTP, users or SQL: `cache_salt`, `fairness_key`, `priority` and
    `max_kv_share` are opaque tags. The server runs the same pieces, the core on a thread or
    in a process of its own (engine/async_llm.py, engine/core_client/).
    """

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        config = config or EngineConfig(**kwargs)
        self.config = config
        model_dir = resolve_model_dir(config.model)
        tokenizer = load_tokenizer(model_dir)
        eos = frozenset(eos_token_ids(model_dir, tokenizer))
        self.engine_core = EngineCore(config, model_dir, eos)
        self.front_end = EngineFrontEnd(
            EngineInfo(str(model_dir), default_model_name(config.model),
                       self.engine_core.max_model_len, generation_max_new_tokens(model_dir),
                       self.engine_core.spec.vocab_size, sorted(eos),
                       vision=self.engine_core.vision), tokenizer)
        front = self.front_end
        self.model_dir, self.model_name, self.tokenizer = model_dir, front.model_name, tokenizer
        # The model's default answer length (generation_config's max_new_tokens), or None.
        self.max_new_tokens = front.max_new_tokens
        self.max_model_len = front.max_model_len
        self.input_processor = front.input_processor
        self.output_processor = front.output_processor
        self.grammar_compiler = front.grammar_compiler
        self.multimodal_processor = front.multimodal_processor

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (idempotent). An engine that is
        never closed stops them when it is garbage-collected or the interpreter exits."""
        self.engine_core.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | None,
                    params: SamplingParams, *,
                    cache_salt: str | None = None, check_max_tokens: bool = False,
                    output_kind: OutputKind = OutputKind.DELTA, fairness_key: str | None = None,
                    priority: float = 1.0, max_kv_share: float | None = None,
                    background: bool = False, multimodal: MultiModalPrompt | None = None
                    ) -> None:
        """Queue a request. A prompt is text or token ids, or, with images, `multimodal`
        (made by self.multimodal_processor; its token_ids are the prompt, and `prompt` is
        None or those ids). Raises ImageInputError for images on a model without vision,
        PromptTooLongError or
        ValueError (an empty prompt, ids outside the vocabulary, an id in use, a priority
        that is not a positive weight, a max_kv_share outside (0, 1], a structured-output
        spec that does not compile: StructuredOutputError). A structured-output grammar is
        compiled here, before the request is queued (cached per spec).

        `fairness_key`, `priority`, `max_kv_share`: what the scheduling policy shares the
        engine by (engine/core/scheduling_policy.py); fcfs ignores them. `background`: work
        nobody waits to read, which yields to every other request's prompt work
        (engine/core/scheduler.py), under every policy.

        With check_max_tokens, a max_tokens that would run past max_model_len is refused
        (the server's behaviour); otherwise generation just stops at max_model_len.
        """
        if multimodal is not None:
            if not self.front_end.info.vision:
                raise ImageInputError(f"The model {self.model_name} does not take images.")
            if prompt is not None and prompt != multimodal.token_ids:
                raise ValueError("With multimodal=, the prompt is its token_ids.")
            prompt = multimodal.token_ids
        if prompt is None:
            raise ValueError("A request needs a prompt.")
        ids = self.input_processor.encode(prompt)
        self.input_processor.check_prompt(ids, params.max_tokens if check_max_tokens else None)
        grammar = (None if params.structured_outputs is None
                   else self.grammar_compiler.compile(params.structured_outputs))
        core_requests = self.input_processor.core_requests(
            request_id, ids, params, cache_salt, fairness_key=fairness_key, priority=priority,
            max_kv_share=max_kv_share, background=background, grammar=grammar,
            multimodal=multimodal)
        self.output_processor.add_request(request_id, prompt if isinstance(prompt, str) else None,
                                          core_requests, output_kind)
        for core_request in core_requests:
            self.engine_core.add_request(core_request)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. Returns False if it was unknown/finished."""
        core_ids = self.output_processor.abort_request(request_id)
        if core_ids is None:
            return False
        self.engine_core.abort_requests(core_ids)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    # -- stepping ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step: schedule -> execute -> update (the core), then process the
        outputs; returns what changed for each request (its error set if the engine failed
        it alone)."""
        processed = self.output_processor.process_outputs(self.engine_core.step())
        self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def stats(self) -> EngineStats:
        return self.engine_core.stats()

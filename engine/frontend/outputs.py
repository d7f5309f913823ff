"""What the engine hands back: plain dataclasses, no tensors."""

from __future__ import annotations

from dataclasses import dataclass

from officellm.engine.core.logprob import Logprob

# One entry per generated token: token id -> Logprob (the chosen token plus the top-k).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token, the same shape; None for the first (nothing comes before it).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One of a request's n sequences.

    For a request added with OutputKind.DELTA (streaming) the token_ids/text/logprobs are
    what the step added; with OutputKind.FINAL (`LLM.generate`, a non-streamed answer) they
    are the whole output, reported once at the end.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token that ended it
    logprobs: SampleLogprobs | None = None
    num_output_tokens: int = 0  # tokens generated so far in total (not only this delta)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock times (time.monotonic()) of one request's life."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """The state of one request after an engine step (or at the end, from `LLM.generate`)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the engine failed this request alone
    # SamplingParams.prompt_logprobs' entries: on the request's first output with a token
    # (streamed, DELTA) or on its one output (FINAL); None otherwise.
    prompt_logprobs: PromptLogprobs | None = None

"""What an engine process and the server say to each other (over channel.py's frames). Only
these types are decoded, so a frame can never make an object the schema does not name."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from officellm.engine.config import EngineConfig
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.frontend.front_end import EngineInfo
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.multimodal.inputs import ImageFeature, MultiModalPrompt
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

MAX_TOKENS_ON_THE_WIRE = 2**62


@dataclass(frozen=True)
class WireImage:
    """An ImageFeature as it travels: its pixel tensor as raw bytes with its dtype's name
    (torch's, e.g. "float32") and shape."""

    offset: int
    length: int
    content_hash: str
    pixels: bytes
    dtype: str
    shape: list[int]
    grid_thw: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, image: ImageFeature) -> WireImage:
        import torch

        pixels = image.pixel_values.detach().cpu().contiguous()
        raw = pixels.view(-1).view(torch.uint8).numpy().tobytes()
        return cls(image.offset, image.length, image.content_hash, raw,
                   str(pixels.dtype).removeprefix("torch."), list(pixels.shape), image.grid_thw)

    def feature(self) -> ImageFeature:
        import torch

        dtype = getattr(torch, self.dtype)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"Not a tensor dtype: {self.dtype!r}")
        pixels = torch.frombuffer(bytearray(self.pixels), dtype=torch.uint8).view(dtype)
        grid = None if self.grid_thw is None else tuple(self.grid_thw)
        return ImageFeature(self.offset, self.length, self.content_hash,
                            pixels.reshape(self.shape), grid)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WireRequest:
    """An EngineCoreRequest as it travels: its grammar is compiled again on arrival."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int | None
    cache_salt: str | None
    fairness_key: str | None
    priority: float
    max_kv_share: float | None
    background: bool = False
    # A prompt with images: its images (the prompt's token ids are prompt_token_ids).
    images: list[WireImage] | None = None

    @classmethod
    def of(cls, r: EngineCoreRequest) -> WireRequest:
        params = r.params
        assert isinstance(params, SamplingParams)
        if params.max_tokens is not None and params.max_tokens > MAX_TOKENS_ON_THE_WIRE:
            # A max_tokens past any window means "to the window" (the core stops there), and
            # msgpack carries integers of 64 bits: 10**30 from a client is the same request.
            params = replace(params, max_tokens=MAX_TOKENS_ON_THE_WIRE)
        images = (None if r.multimodal is None
                  else [WireImage.of(image) for image in r.multimodal.images])
        return cls(r.request_id, r.prompt_token_ids, params, r.seed, r.cache_salt,
                   r.fairness_key, r.priority, r.max_kv_share, r.background, images)

    def core_request(self, grammar: object | None) -> EngineCoreRequest:
        multimodal = (None if self.images is None else MultiModalPrompt(
            self.prompt_token_ids, tuple(image.feature() for image in self.images)))
        return EngineCoreRequest(self.request_id, self.prompt_token_ids, self.params, self.seed,
                                 self.cache_salt, self.fairness_key, self.priority,
                                 self.max_kv_share, background=self.background,
                                 grammar=grammar,  # type: ignore[arg-type]
                                 multimodal=multimodal)


# -- the server to the engine process ---------------------------------------------------------
class Start(msgspec.Struct, tag=True):
    config: EngineConfig
    label: str  # the model's name, for the process's log lines
    log_level: int


class Add(msgspec.Struct, tag=True):
    requests: list[WireRequest]


class Abort(msgspec.Struct, tag=True):
    core_ids: list[str]


class Purge(msgspec.Struct, tag=True):
    call: int
    cache_salt: str | None


class Compile(msgspec.Struct, tag=True):
    call: int
    params: StructuredOutputsParams


class Stop(msgspec.Struct, tag=True):
    pass


# -- the engine process to the server ---------------------------------------------------------
class Ready(msgspec.Struct, tag=True):
    info: EngineInfo
    stats: EngineStats


class LoadFailed(msgspec.Struct, tag=True):
    reason: str  # LoadFailure.reason: one line


class Step(msgspec.Struct, tag=True):
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None  # None: unchanged (outputs sent from outside the loop)


class Purged(msgspec.Struct, tag=True):
    call: int
    dropped: int
    error: str | None = None


class Compiled(msgspec.Struct, tag=True):
    call: int
    error: str | None = None  # StructuredOutputError's sentence


class Stopped(msgspec.Struct, tag=True):
    pass


ToEngine = Start | Add | Abort | Purge | Compile | Stop
FromEngine = Ready | LoadFailed | Step | Purged | Compiled | Stopped

"""What an embedding process and the server say to each other (over core_client/channel.py's
frames): the model to load, inputs to tokenize or encode, and the answers."""

from __future__ import annotations

import msgspec

from officellm.engine.embedding.sentence_encoder import EncoderInfo


# -- the server to the embedding process ------------------------------------------------------
class LoadEncoder(msgspec.Struct, tag=True):
    model_dir: str
    label: str
    log_level: int


class Tokenize(msgspec.Struct, tag=True):
    call: int
    text: str
    max_length: int | None


class Encode(msgspec.Struct, tag=True):
    call: int
    batch: list[list[int]]


class StopEncoder(msgspec.Struct, tag=True):
    pass


# -- the embedding process to the server ------------------------------------------------------
class EncoderReady(msgspec.Struct, tag=True):
    model_dir: str
    info: EncoderInfo


class EncoderLoadFailed(msgspec.Struct, tag=True):
    reason: str


class Tokenized(msgspec.Struct, tag=True):
    call: int
    ids: list[int]


class Encoded(msgspec.Struct, tag=True):
    call: int
    vectors: bytes  # float32, row after row
    error: str | None = None


ToEncoder = LoadEncoder | Tokenize | Encode | StopEncoder
FromEncoder = EncoderReady | EncoderLoadFailed | Tokenized | Encoded

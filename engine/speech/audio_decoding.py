"""Audio bytes (wav, mp3, m4a, ogg, webm, flac: whatever FFmpeg decodes) to the 16 kHz mono
float32 samples Whisper reads, through PyAV (FFmpeg's own decoders and resampler, wheels
with FFmpeg inside, so no system FFmpeg is needed)."""

from __future__ import annotations

import io

import av
import numpy as np

SAMPLE_RATE = 16_000


class AudioDecodeError(ValueError):
    """The bytes are not audio this server can read; the message says why, for the client."""


def decode_audio(data: bytes, max_seconds: float | None = None) -> np.ndarray:
    """`data` decoded and resampled to 16 kHz mono float32 in [-1, 1]. AudioDecodeError if
    it is empty, not audio, truncated before any sound, or longer than `max_seconds`."""
    if not data:
        raise AudioDecodeError("The audio file is empty.")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, UnicodeDecodeError) as exc:
        raise AudioDecodeError(f"The file is not audio FFmpeg can read: {exc}") from exc
    with container:
        if not container.streams.audio:
            raise AudioDecodeError("The file has no audio stream.")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        pieces: list[np.ndarray] = []
        total = 0
        limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    piece = out.to_ndarray().reshape(-1)
                    pieces.append(piece)
                    total += piece.size
                if limit is not None and total > limit:
                    raise AudioDecodeError(
                        f"The audio is longer than this server's limit of {max_seconds:g} s "
                        "(--audio-max-seconds).")
            for out in resampler.resample(None):  # what the resampler still holds
                pieces.append(out.to_ndarray().reshape(-1))
        except av.FFmpegError as exc:
            if not pieces:
                raise AudioDecodeError(f"The audio could not be decoded: {exc}") from exc
            # A file cut short: what was decoded before the damage is kept, as FFmpeg's
            # own command line does.
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AudioDecodeError("The audio has no samples (zero length).")
    if limit is not None and samples.size > limit:
        raise AudioDecodeError(f"The audio is longer than this server's limit of "
                               f"{max_seconds:g} s (--audio-max-seconds).")
    return np.ascontiguousarray(samples, dtype=np.float32)

"""Audio bytes (wav, mp3, m4a, ogg, webm, flac: whatever FFmpeg decodes) to the 16 kHz mono
float32 samples Whisper reads, through PyAV (FFmpeg's own decoders and resampler, wheels
with FFmpeg inside, so no system FFmpeg is needed)."""

from __future__ import annotations

import io

import av
import numpy as np

SAMPLE_RATE = 16_000
# Decoded frames are joined into frames of about this many samples before resampling: a
# codec's frames are small (FLAC's 1,152 samples), and the resampler's cost is per call.
RESAMPLE_CHUNK = 1 << 17


class AudioDecodeError(ValueError):
    """The bytes are not audio this server can read; the message says why, for the client."""


def _too_long(max_seconds: float | None) -> str:
    return (f"The audio is longer than this server's limit of {max_seconds:g} s "
            "(--audio-max-seconds).")


class _Pending:
    """Decoded frames of one format, layout and rate, joined into one frame."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.samples = 0
        self.shape: tuple[str, str, int] | None = None

    def takes(self, frame: av.AudioFrame) -> bool:
        """Add `frame` if it matches what is pending (or nothing is); False if not."""
        shape = (frame.format.name, frame.layout.name, frame.sample_rate)
        if self.shape is not None and shape != self.shape:
            return False
        self.shape = shape
        self.arrays.append(frame.to_ndarray())
        self.samples += frame.samples
        return True

    @property
    def seconds(self) -> float:
        return self.samples / self.shape[2] if self.shape is not None else 0.0

    def frame(self) -> av.AudioFrame:
        """The pending frames as one (and nothing pending after)."""
        assert self.shape is not None
        fmt, layout, rate = self.shape
        joined = av.AudioFrame.from_ndarray(np.concatenate(self.arrays, axis=1), format=fmt,
                                            layout=layout)
        joined.sample_rate = rate
        self.arrays, self.samples, self.shape = [], 0, None
        return joined


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
        pending = _Pending()

        def resample(frame: av.AudioFrame | None) -> None:
            nonlocal total
            for out in resampler.resample(frame):
                piece = out.to_ndarray().reshape(-1)
                pieces.append(piece)
                total += piece.size

        try:
            for frame in container.decode(stream):
                if not pending.takes(frame):
                    resample(pending.frame())
                    pending.takes(frame)
                if pending.samples >= RESAMPLE_CHUNK:
                    resample(pending.frame())
                if (max_seconds is not None
                        and total / SAMPLE_RATE + pending.seconds > max_seconds):
                    raise AudioDecodeError(_too_long(max_seconds))
        except av.FFmpegError as exc:
            if not pieces and not pending.samples:
                raise AudioDecodeError(f"The audio could not be decoded: {exc}") from exc
            # A file cut short: what was decoded before the damage is kept, as FFmpeg's
            # own command line does.
        if pending.samples:
            resample(pending.frame())
        resample(None)  # what the resampler still holds
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AudioDecodeError("The audio has no samples (zero length).")
    if limit is not None and samples.size > limit:
        raise AudioDecodeError(_too_long(max_seconds))
    return np.ascontiguousarray(samples, dtype=np.float32)

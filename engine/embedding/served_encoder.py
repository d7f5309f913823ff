"""The model an embedding process serves (encoder_process.py is its entry point): loaded
from the server's LoadEncoder; tokenizing is answered at once on the reading thread, batches
are encoded one after another on a thread of their own, so a request's tokenizing never
waits for another's batch."""

from __future__ import annotations

import logging
import queue
import socket
import threading

import torch

from officellm.engine.core_client.channel import Channel
from officellm.engine.core_client.child_process import child_logging
from officellm.engine.embedding import encoder_wire as wire
from officellm.engine.embedding.encoders import Encoder, load_encoder
from officellm.engine.model_lifecycle import REFUSALS, LoadFailure

logger = logging.getLogger("officellm.embedder")


def _encode_batches(channel: Channel, encoder: Encoder,
                    batches: queue.SimpleQueue[wire.Encode | None]) -> None:
    while (message := batches.get()) is not None:
        try:
            vectors = encoder.encode(message.batch).to(torch.float32).contiguous()
            channel.send(wire.Encoded(message.call, vectors.numpy().tobytes()))
        except Exception as exc:  # noqa: BLE001 - this batch fails; the next is tried afresh
            logger.exception("Encoding a batch of %d inputs failed", len(message.batch))
            channel.send(wire.Encoded(message.call, b"", f"Encoding failed: {exc}"))


class ServedEncoder:
    """The embedding process's model and the socket it answers on."""

    def __init__(self, channel: Channel, encoder: Encoder) -> None:
        self.channel, self.encoder = channel, encoder

    @classmethod
    def load(cls, fd: int) -> ServedEncoder | None:
        """Read the server's LoadEncoder from socket `fd`, load the model and say Ready;
        None if it did not load (the server has been told why)."""
        channel = Channel(socket.socket(fileno=fd), wire.ToEncoder)
        start = channel.receive()
        if not isinstance(start, wire.LoadEncoder):
            return None
        child_logging(start.log_level, start.label)
        try:
            encoder = load_encoder(start.model_dir)
        except BaseException as exc:  # noqa: BLE001 - the server hears why, in one line
            failure = LoadFailure.of(exc)
            if not isinstance(exc, REFUSALS):  # a bug: its traceback is only here
                logger.error("Loading the embedding model failed", exc_info=exc)
            channel.send(wire.EncoderLoadFailed(failure.reason))
            return None
        channel.send(wire.EncoderReady(str(encoder.model_dir), encoder.info))
        return cls(channel, encoder)

    def serve(self) -> int:
        """Answer until the server says stop or goes; the process's exit status."""
        channel, encoder = self.channel, self.encoder
        batches: queue.SimpleQueue[wire.Encode | None] = queue.SimpleQueue()
        worker = threading.Thread(target=_encode_batches, args=(channel, encoder, batches),
                                  name="encode", daemon=True)
        worker.start()
        while True:
            message = channel.receive()
            if message is None or isinstance(message, wire.StopEncoder):
                break
            if isinstance(message, wire.Tokenize):
                channel.send(wire.Tokenized(message.call,
                                            encoder.tokenize(message.text, message.max_length)))
            elif isinstance(message, wire.Encode):
                batches.put(message)
        batches.put(None)
        worker.join()
        return 0

"""The embedding process: one embedding model, started by the server
(`python -m officellm.engine.embedding.encoder_process FD PARENT_PID`, process_encoder.py is
the server's side). Tokenizing is answered at once on the reading thread; batches are encoded
one after another on a thread of their own, so a request's tokenizing never waits for
another's batch."""

from __future__ import annotations

import logging
import queue
import socket
import sys
import threading

import torch

from officellm.engine.core_client.channel import Channel
from officellm.engine.core_client.child_process import child_logging, die_with_parent
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


def main(argv: list[str]) -> int:
    fd, parent_pid = int(argv[0]), int(argv[1])
    die_with_parent(parent_pid)
    channel = Channel(socket.socket(fileno=fd), wire.ToEncoder)
    start = channel.receive()
    if not isinstance(start, wire.LoadEncoder):
        return 1
    child_logging(start.log_level, start.label)
    try:
        encoder = load_encoder(start.model_dir)
    except BaseException as exc:  # noqa: BLE001 - the server hears why, in one line
        failure = LoadFailure.of(exc)
        if not isinstance(exc, REFUSALS):  # a bug: its traceback is only here
            logger.error("Loading the embedding model failed", exc_info=exc)
        channel.send(wire.EncoderLoadFailed(failure.reason))
        return 1
    channel.send(wire.EncoderReady(str(encoder.model_dir), encoder.info))
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
